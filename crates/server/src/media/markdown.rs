//! TGI's images in `inputs`: markdown `![alt](url)`. For a vision-language model each becomes
//! the model's image marker in the text (`<|vision_start|><|image_pad|><|vision_end|>` for
//! Qwen-VL) and an item to load, as TGI does.

/// `text` with every markdown image replaced by `marker`, and the images' URLs in order.
pub fn extract_images(text: &str, marker: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(text.len());
    let mut urls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("![") {
        let after = &rest[at + 2..];
        // `![alt](url)`: the alt text has no ']' and the URL no ')' or whitespace.
        let parsed = after.find("](").and_then(|close| {
            let alt = &after[..close];
            let tail = &after[close + 2..];
            let end = tail.find(')')?;
            let url = &tail[..end];
            (!alt.contains(['[', ']', '\n'])
                && !url.is_empty()
                && !url.contains(char::is_whitespace))
            .then_some((url, 2 + close + 2 + end + 1))
        });
        match parsed {
            Some((url, len)) => {
                out.push_str(&rest[..at]);
                out.push_str(marker);
                urls.push(url.to_string());
                rest = &rest[at + len..];
            }
            None => {
                out.push_str(&rest[..at + 2]);
                rest = &rest[at + 2..];
            }
        }
    }
    out.push_str(rest);
    (out, urls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_markdown_images_in_order() {
        let (t, urls) = extract_images(
            "Look ![](data:image/png;base64,AAA) and ![a cat](https://x.org/c.jpg)? ![bad](no end",
            "<img>",
        );
        assert_eq!(t, "Look <img> and <img>? ![bad](no end");
        assert_eq!(
            urls,
            vec!["data:image/png;base64,AAA", "https://x.org/c.jpg"]
        );
        let (t, urls) = extract_images("no images [x](y) !", "<img>");
        assert_eq!((t.as_str(), urls.len()), ("no images [x](y) !", 0));
    }
}
