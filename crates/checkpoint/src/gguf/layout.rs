//! How an HF tensor is read out of a GGUF tensor whose rows, columns, shape or values
//! llama.cpp's converter rearranged: the inverse applied when the tensor is read
//! (`weights/gguf_source.rs`), in f32 or, where whole rows or blocks move, on the stored
//! blocks themselves.

/// The rearrangement that turns a GGUF tensor into its HF tensor. The default reads it as
/// stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// `rows[hf_row] = gguf_row` along the first HF dimension: a permutation, or a selection
    /// when one GGUF tensor holds several HF tensors (Qwen3-Next's `ssm_ba`).
    pub rows: Option<Vec<usize>>,
    /// `cols[hf_col] = gguf_col` within every row of a matrix.
    pub cols: Option<Vec<usize>>,
    /// The HF shape where it differs from the GGUF's by more than the rows selected (a
    /// squeezed dimension put back); same element count.
    pub shape: Option<Vec<usize>>,
    pub values: Values,
}

/// An elementwise transformation the converter applied to the values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Values {
    #[default]
    AsStored,
    /// The file holds `-exp(A_log)` (`ssm_a`); HF holds `A_log = ln(-x)`.
    LnOfNegated,
}

impl Values {
    pub fn apply(self, x: &mut [f32]) {
        match self {
            Values::AsStored => {}
            // In f64: the file's value is -exp(A_log) rounded to f32, and its log recovers
            // A_log within an ulp or two of it.
            Values::LnOfNegated => x.iter_mut().for_each(|v| *v = (-f64::from(*v)).ln() as f32),
        }
    }
}

impl Layout {
    pub fn rows(rows: Vec<usize>) -> Self {
        Layout {
            rows: Some(rows),
            ..Layout::default()
        }
    }

    /// True when the tensor is read as stored.
    pub fn is_identity(&self) -> bool {
        *self == Layout::default()
    }
}

/// Rows `order` of a row-major tensor of rows `row_len` long, in that order.
pub fn gather_rows(x: &[f32], row_len: usize, order: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(order.len() * row_len);
    for &r in order {
        out.extend_from_slice(&x[r * row_len..(r + 1) * row_len]);
    }
    out
}

/// Every row of a row-major `[rows, cols]` matrix with its columns in the order `order` names.
pub fn gather_cols(x: &[f32], cols: usize, order: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(cols.max(1)) {
        out.extend(order.iter().map(|&c| row[c]));
    }
    out
}

/// `order` as whole blocks of `block` columns (`blocks[hf_block] = gguf_block`), when it moves
/// only whole, aligned blocks and keeps the columns inside each; None otherwise.
pub fn block_order(order: &[usize], block: usize) -> Option<Vec<usize>> {
    if block == 0 || !order.len().is_multiple_of(block) {
        return None;
    }
    order
        .chunks_exact(block)
        .map(|run| {
            let first = run[0];
            let whole =
                first.is_multiple_of(block) && run.iter().zip(first..).all(|(&c, i)| c == i);
            whole.then_some(first / block)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_columns_are_gathered() {
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect(); // [[0 1 2] [3 4 5]]
        assert_eq!(gather_rows(&x, 3, &[1, 0]), [3., 4., 5., 0., 1., 2.]);
        assert_eq!(gather_rows(&x, 3, &[1]), [3., 4., 5.]);
        assert_eq!(gather_cols(&x, 3, &[2, 0, 1]), [2., 0., 1., 5., 3., 4.]);
    }

    #[test]
    fn block_moves_are_recognized() {
        let heads = |order: &[usize], d: usize| -> Vec<usize> {
            order.iter().flat_map(|&h| h * d..(h + 1) * d).collect()
        };
        // Heads of 64 columns move as pairs of 32-column blocks...
        assert_eq!(block_order(&heads(&[1, 0], 64), 32), Some(vec![2, 3, 0, 1]));
        // ...but not inside one 256-column block, nor when heads are narrower than a block.
        assert_eq!(block_order(&heads(&[1, 0, 3, 2], 64), 256), None);
        assert_eq!(block_order(&heads(&[1, 0, 3, 2], 16), 32), None);
        assert_eq!(block_order(&heads(&[0, 1, 2, 3], 16), 32), Some(vec![0, 1]));
    }

    #[test]
    fn ssm_a_gives_back_a_log() {
        let a_log = [-1.5f32, 0.0, 0.7, 2.75];
        let mut x: Vec<f32> = a_log.iter().map(|&v| -(v.exp())).collect();
        Values::LnOfNegated.apply(&mut x);
        for (got, want) in x.iter().zip(a_log) {
            assert!((got - want).abs() <= 2.0 * f32::EPSILON * want.abs().max(1.0));
        }
    }
}
