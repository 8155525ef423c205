//! MobileNetV2's architecture (Sandler et al. 2018, as torchvision builds it with width 1.0):
//! the stem, 17 inverted-residual blocks, the 1×1 head and the classifier, with the
//! state_dict names and shapes of `torchvision.models.mobilenet_v2`.

/// Channels out of the stem (`features.0`).
pub const STEM_CHANNELS: usize = 32;
/// Channels out of the head (`features.18`).
pub const HEAD_CHANNELS: usize = 1280;
/// Classifier outputs (`classifier.1`).
pub const NUM_CLASSES: usize = 1000;
/// BatchNorm epsilon (PyTorch's default, which torchvision keeps).
pub const BN_EPS: f64 = 1e-5;

/// torchvision's `inverted_residual_setting`: `(t, c, n, s)` = expansion, output channels,
/// repeats, stride of the first repeat.
pub const SETTING: [(usize, usize, usize, usize); 7] =
    [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)];

/// One inverted-residual block: `features.{index}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpec {
    /// Its index in `features` (1..=17).
    pub index: usize,
    /// Input channels.
    pub inp: usize,
    /// Expanded (hidden) channels: `inp · t`.
    pub hidden: usize,
    /// Output channels.
    pub oup: usize,
    /// Depthwise stride (1 or 2).
    pub stride: usize,
}

impl BlockSpec {
    /// Whether the block has the expanding 1×1 conv (`t ≠ 1`).
    pub fn has_expand(&self) -> bool {
        self.hidden != self.inp
    }

    /// Whether the input is added to the output (stride 1 and `inp = oup`).
    pub fn residual(&self) -> bool {
        self.stride == 1 && self.inp == self.oup
    }

    /// The state_dict prefixes of the block's convs and BatchNorms, in order: `(conv, bn)` for
    /// expand (if any), depthwise and project.
    pub fn layer_names(&self) -> Vec<(String, String)> {
        let p = format!("features.{}.conv", self.index);
        if self.has_expand() {
            vec![
                (format!("{p}.0.0"), format!("{p}.0.1")),
                (format!("{p}.1.0"), format!("{p}.1.1")),
                (format!("{p}.2"), format!("{p}.3")),
            ]
        } else {
            vec![(format!("{p}.0.0"), format!("{p}.0.1")), (format!("{p}.1"), format!("{p}.2"))]
        }
    }
}

/// The 17 blocks in order.
pub fn blocks() -> Vec<BlockSpec> {
    let mut v = Vec::new();
    let mut inp = STEM_CHANNELS;
    for (t, c, n, s) in SETTING {
        for i in 0..n {
            v.push(BlockSpec { index: v.len() + 1, inp, hidden: inp * t, oup: c, stride: if i == 0 { s } else { 1 } });
            inp = c;
        }
    }
    v
}

/// Every conv weight of the network with its shape, in order, and the BatchNorm that follows
/// it (all but the classifier have one; every conv has `bias=False`).
pub fn conv_layers() -> Vec<(String, [usize; 4], String)> {
    let mut v = vec![("features.0.0".to_string(), [STEM_CHANNELS, 3, 3, 3], "features.0.1".to_string())];
    for b in blocks() {
        let names = b.layer_names();
        let mut shapes = Vec::new();
        if b.has_expand() {
            shapes.push([b.hidden, b.inp, 1, 1]);
        }
        shapes.push([b.hidden, 1, 3, 3]);
        shapes.push([b.oup, b.hidden, 1, 1]);
        for ((conv, bn), shape) in names.into_iter().zip(shapes) {
            v.push((conv, shape, bn));
        }
    }
    v.push(("features.18.0".into(), [HEAD_CHANNELS, 320, 1, 1], "features.18.1".into()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_matches_torchvision() {
        let b = blocks();
        assert_eq!(b.len(), 17);
        assert_eq!((b[0].inp, b[0].hidden, b[0].oup, b[0].stride), (32, 32, 16, 1));
        assert_eq!((b[1].inp, b[1].hidden, b[1].oup, b[1].stride), (16, 96, 24, 2));
        assert_eq!((b[16].inp, b[16].hidden, b[16].oup, b[16].stride), (160, 960, 320, 1));
        assert_eq!(b.iter().filter(|b| b.residual()).count(), 10);
        // 52 convs: the stem, 2 + 16·3 in the blocks, the head.
        assert_eq!(conv_layers().len(), 52);
        assert_eq!(conv_layers()[2].0, "features.1.conv.1");
    }
}
