//! M-RoPE positions (Qwen2-VL's `get_rope_index`): a text token's three components are all its
//! position; an item's tokens are at the item's start plus (time, row, column) offsets; the text
//! after an item continues from the item's largest position plus one, so a sequence's positions
//! trail its token indices by the `delta` its items accumulate (`rope_extent - tokens` each).

use super::VisionInput;

/// The temporal offset of grid step `t` (`(t · t_scale)` truncated, as the reference does in
/// f32).
pub fn temporal_offset(t: usize, t_scale: f32) -> u32 {
    (t as f32 * t_scale) as u32
}

/// How much an item shifts the positions of the tokens after it.
pub fn item_delta(input: &VisionInput) -> i64 {
    input.rope_extent() as i64 - input.tokens() as i64
}

/// A media run inside one chunk: its first position in the chunk, its length, and which of the
/// item's tokens it starts at.
#[derive(Debug, Clone, Copy)]
pub struct RunAt<'a> {
    pub offset: usize,
    pub len: usize,
    pub item_offset: usize,
    pub input: &'a VisionInput,
}

/// The M-RoPE positions of a chunk of `len` tokens starting at sequence index `start_pos`,
/// appended to `out` as (t, h, w) triples. `delta` is the shift in effect at the chunk's first
/// token from the items that end before it; `runs` are the chunk's media runs in order.
pub fn chunk_positions(
    start_pos: usize,
    len: usize,
    mut delta: i64,
    runs: &[RunAt<'_>],
    out: &mut Vec<u32>,
) {
    let text = |from: usize, to: usize, delta: i64, out: &mut Vec<u32>| {
        for i in from..to {
            let p = ((start_pos + i) as i64 + delta).max(0) as u32;
            out.extend([p, p, p]);
        }
    };
    let mut at = 0;
    for r in runs {
        text(at, r.offset, delta, out);
        // The item's first token sits at sequence index `item_start`.
        let item_start = (start_pos + r.offset - r.item_offset) as i64;
        let s = (item_start + delta).max(0) as u32;
        let [_, h, w] = r.input.token_grid();
        for j in r.item_offset..r.item_offset + r.len {
            let (ti, rest) = (j / (h * w).max(1), j % (h * w).max(1));
            let (hi, wi) = (rest / w.max(1), rest % w.max(1));
            out.extend([
                s + temporal_offset(ti, r.input.t_scale),
                s + hi as u32,
                s + wi as u32,
            ]);
        }
        at = r.offset + r.len;
        if r.item_offset + r.len >= r.input.tokens() {
            delta += item_delta(r.input);
        }
    }
    text(at, len, delta, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vision::MediaKind;

    fn image(h: usize, w: usize) -> VisionInput {
        VisionInput {
            kind: MediaKind::Image,
            grid_thw: [1, h, w],
            pixels: Vec::new(),
            merge_size: 2,
            t_scale: 1.0,
        }
    }

    #[test]
    fn text_after_an_image_continues_from_its_largest_position() {
        // 3 text tokens, a 4x6-patch image (2x3 tokens), 2 text tokens.
        let img = image(4, 6);
        let mut out = Vec::new();
        let runs = [RunAt {
            offset: 3,
            len: 6,
            item_offset: 0,
            input: &img,
        }];
        chunk_positions(0, 11, 0, &runs, &mut out);
        let t: Vec<_> = out.chunks(3).map(|p| [p[0], p[1], p[2]]).collect();
        assert_eq!(t[2], [2, 2, 2]);
        assert_eq!(t[3], [3, 3, 3]);
        assert_eq!(t[5], [3, 3, 5]);
        assert_eq!(t[8], [3, 4, 5]);
        // Largest image position is 5: text resumes at 6.
        assert_eq!(t[9], [6, 6, 6]);
        assert_eq!(item_delta(&img), 3 - 6);
        // The same positions when the chunk is cut after the image.
        let mut tail = Vec::new();
        chunk_positions(9, 2, item_delta(&img), &[], &mut tail);
        assert_eq!(tail, out[27..]);
    }
}
