//! A prompt as a list of spans: text token ids, or one media item (an image) that stands in
//! the sequence as `len` copies of its placeholder token. The engine runs the flat token ids
//! (media positions hold the placeholder; a vision encoder's embeddings will replace them);
//! the KV manager keys media positions by the item's content hash, so the same image reuses
//! its cached blocks and a different image with the same placeholders never does; and
//! admission never cuts a media span between two steps.

use std::ops::{Deref, Range};
use std::sync::Arc;

use lmi_engine_core::vision::VisionInput;

/// A media item's content hash: at least 128 bits of a cryptographic hash of its bytes,
/// computed by whoever decodes the item (a collision would serve another image's KV).
pub type MediaHash = u128;

/// One media item in a prompt.
#[derive(Debug, Clone)]
pub struct MediaSpan {
    /// The token id its positions carry (the model's image pad token).
    pub placeholder: u32,
    /// Positions it takes in the sequence.
    pub len: usize,
    pub hash: MediaHash,
    /// Its patches for the engine's vision tower (None in tests of the scheduler alone).
    pub input: Option<Arc<VisionInput>>,
}

impl MediaSpan {
    /// How much the item shifts M-RoPE positions after it (0 without patches).
    pub fn rope_delta(&self) -> i64 {
        self.input
            .as_deref()
            .map_or(0, lmi_engine_core::vision::mrope::item_delta)
    }
}

/// Items are the same when their placement and content hash are (the hash covers the bytes
/// the patches were made from).
impl PartialEq for MediaSpan {
    fn eq(&self, o: &Self) -> bool {
        (self.placeholder, self.len, self.hash) == (o.placeholder, o.len, o.hash)
    }
}

impl Eq for MediaSpan {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Span {
    Text(Vec<u32>),
    Media(MediaSpan),
}

/// A media item at its place in the prompt: positions `start .. start + item.len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedMedia {
    pub start: usize,
    pub item: MediaSpan,
}

impl PlacedMedia {
    pub fn end(&self) -> usize {
        self.start + self.item.len
    }
}

/// The spans, stored flat: the token ids the engine runs and where each media item sits.
/// Dereferences to the token ids, so text-only code reads it as the `Vec<u32>` it was.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prompt {
    tokens: Vec<u32>,
    /// In order, not overlapping.
    media: Vec<PlacedMedia>,
}

impl Prompt {
    /// A text-only prompt.
    pub fn text(tokens: Vec<u32>) -> Self {
        Prompt {
            tokens,
            media: Vec::new(),
        }
    }

    pub fn from_spans(spans: impl IntoIterator<Item = Span>) -> Self {
        let mut p = Prompt::default();
        for s in spans {
            match s {
                Span::Text(t) => p.tokens.extend(t),
                Span::Media(item) => {
                    p.tokens
                        .extend(std::iter::repeat_n(item.placeholder, item.len));
                    p.media.push(PlacedMedia {
                        start: p.tokens.len() - item.len,
                        item,
                    });
                }
            }
        }
        p
    }

    /// The spans again (adjacent text spans merged).
    pub fn spans(&self) -> Vec<Span> {
        let mut out = Vec::new();
        let mut at = 0;
        for m in &self.media {
            if m.start > at {
                out.push(Span::Text(self.tokens[at..m.start].to_vec()));
            }
            out.push(Span::Media(m.item.clone()));
            at = m.end();
        }
        if at < self.tokens.len() {
            out.push(Span::Text(self.tokens[at..].to_vec()));
        }
        out
    }

    pub fn media(&self) -> &[PlacedMedia] {
        &self.media
    }

    /// The media items with a position in `range`.
    pub fn media_in(&self, range: Range<usize>) -> &[PlacedMedia] {
        media_in(&self.media, range)
    }

    /// Where a chunk that computes positions `start..end` may stop without cutting a media
    /// item: `end` itself, or the start of the item `end` falls inside; `start` when the chunk
    /// begins inside (or at) that item, which must then wait for a budget that holds it whole.
    pub fn chunk_end(&self, start: usize, end: usize) -> usize {
        match self.media_in(end.saturating_sub(1)..end).first() {
            Some(m) if m.end() > end => m.start.max(start),
            _ => end,
        }
    }
}

/// The items of `media` (in order, not overlapping) with a position in `range`.
pub(crate) fn media_in(media: &[PlacedMedia], range: Range<usize>) -> &[PlacedMedia] {
    let from = media.partition_point(|m| m.end() <= range.start);
    let to = media.partition_point(|m| m.start < range.end);
    &media[from..to.max(from)]
}

impl Deref for Prompt {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        &self.tokens
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(tokens: Vec<u32>) -> Self {
        Prompt::text(tokens)
    }
}

impl From<&[u32]> for Prompt {
    fn from(tokens: &[u32]) -> Self {
        Prompt::text(tokens.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(len: usize, hash: MediaHash) -> Span {
        Span::Media(MediaSpan {
            placeholder: 9,
            len,
            hash,
            input: None,
        })
    }

    #[test]
    fn spans_lay_out_flat_and_come_back() {
        let spans = vec![Span::Text(vec![1, 2]), image(3, 7), Span::Text(vec![4])];
        let p = Prompt::from_spans(spans.clone());
        assert_eq!(&p[..], &[1, 2, 9, 9, 9, 4]);
        assert_eq!(p.media()[0].start, 2);
        assert_eq!(p.media()[0].end(), 5);
        assert_eq!(p.spans(), spans);
        assert_eq!(
            Prompt::from(vec![1, 2]).spans(),
            vec![Span::Text(vec![1, 2])]
        );
    }

    #[test]
    fn media_in_finds_overlapping_items() {
        let p = Prompt::from_spans([Span::Text(vec![0; 4]), image(4, 1), image(2, 2)]);
        assert!(p.media_in(0..4).is_empty());
        assert_eq!(p.media_in(3..5).len(), 1);
        assert_eq!(p.media_in(7..9).len(), 2);
        assert_eq!(p.media_in(8..9)[0].item.hash, 2);
        assert!(p.media_in(10..12).is_empty());
    }

    #[test]
    fn chunks_stop_before_an_item_and_never_inside_one() {
        // Text 0..4, an item 4..10, text 10..12.
        let p = Prompt::from_spans([Span::Text(vec![0; 4]), image(6, 1), Span::Text(vec![0; 2])]);
        assert_eq!(p.chunk_end(0, 3), 3);
        assert_eq!(p.chunk_end(0, 4), 4);
        assert_eq!(p.chunk_end(0, 7), 4, "stops before the item");
        assert_eq!(p.chunk_end(4, 9), 4, "an item that does not fit waits");
        assert_eq!(p.chunk_end(6, 9), 6, "also after a cache hit inside it");
        assert_eq!(p.chunk_end(4, 10), 10);
        assert_eq!(p.chunk_end(2, 11), 11);
        // Two items back to back: the cut lands on the second one's start.
        let q = Prompt::from_spans([image(3, 1), image(3, 2)]);
        assert_eq!(q.chunk_end(0, 5), 3);
    }
}
