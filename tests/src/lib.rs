//! Shared harness of the test suite.
