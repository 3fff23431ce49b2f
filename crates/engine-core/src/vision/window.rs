//! Where each patch sits and which patches attend to each other in the vision tower
//! (transformers' `rot_pos_emb` and `get_window_index` for Qwen2-VL / Qwen2.5-VL).

/// (row, column) of every patch of a `[t, h, w]` grid, in the processor's patch order: merge
/// windows of `m × m` patches in raster order, raster order inside each, frame after frame.
pub fn patch_rows_cols(grid: [usize; 3], m: usize) -> Vec<(u32, u32)> {
    let [t, h, w] = grid;
    let mut out = Vec::with_capacity(t * h * w);
    for _ in 0..t {
        for bh in 0..h / m {
            for bw in 0..w / m {
                for ih in 0..m {
                    for iw in 0..m {
                        out.push(((bh * m + ih) as u32, (bw * m + iw) as u32));
                    }
                }
            }
        }
    }
    out
}

/// Boundaries of the attention segments when every frame attends to itself (full attention):
/// `[0, h·w, 2·h·w, …]` over the patches.
pub fn frame_segments(grid: [usize; 3]) -> Vec<usize> {
    let [t, h, w] = grid;
    (0..=t).map(|i| i * h * w).collect()
}

/// Qwen2.5-VL's windows: the order of the merged tokens that groups each window's tokens
/// together (`window_index`: new position → original token), and the window boundaries over
/// the patches in that order (`cu_window_seqlens`, repeated boundaries dropped).
/// `window` is the window side in merged tokens (`window_size / merge / patch`).
pub fn window_index(grid: [usize; 3], m: usize, window: usize) -> (Vec<usize>, Vec<usize>) {
    let [t, h, w] = grid;
    let (lh, lw) = (h / m, w / m);
    let unit = m * m;
    let mut index = Vec::with_capacity(t * lh * lw);
    let mut bounds = vec![0usize];
    // As the reference: pads up to whole windows, one whole extra window when it divides.
    let (nh, nw) = (
        (lh + window - lh % window) / window,
        (lw + window - lw % window) / window,
    );
    for f in 0..t {
        for wh in 0..nh {
            for ww in 0..nw {
                let mut n = 0;
                for r in wh * window..(wh + 1) * window {
                    for c in ww * window..(ww + 1) * window {
                        if r < lh && c < lw {
                            index.push(f * lh * lw + r * lw + c);
                            n += 1;
                        }
                    }
                }
                let last = *bounds.last().unwrap_or(&0);
                if n > 0 {
                    bounds.push(last + n * unit);
                }
            }
        }
    }
    (index, bounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_follow_merge_windows() {
        let p = patch_rows_cols([1, 2, 4], 2);
        assert_eq!(
            p,
            vec![
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
    }

    #[test]
    fn windows_group_tokens_and_skip_padding() {
        // 6x10 patches = 3x5 merged tokens, windows of 2x2 tokens: 2 window rows x 3 columns.
        let (idx, bounds) = window_index([1, 6, 10], 2, 2);
        assert_eq!(idx.len(), 15);
        assert_eq!(&idx[..4], &[0, 1, 5, 6]);
        assert_eq!(&idx[4..8], &[2, 3, 7, 8]);
        assert_eq!(&idx[8..10], &[4, 9]);
        assert_eq!(&idx[10..12], &[10, 11]);
        assert_eq!(bounds, vec![0, 16, 32, 40, 48, 56, 60]);
    }
}
