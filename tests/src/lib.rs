//! Shared harness of tilekit's test suite (being written).
