//! The little XML S3 and STS answer with (flat elements, no attributes we need), read by
//! element name.

/// The inner text of the first `<tag>…</tag>` (a tag with attributes counts too).
pub(crate) fn first<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    all(text, tag).into_iter().next()
}

/// The inner text of every `<tag>…</tag>`, in order.
pub(crate) fn all<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    let close = format!("</{tag}>");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&format!("<{tag}")) {
        let after = &rest[start + tag.len() + 1..];
        // `<Key>` or `<Key attr=…>`, not `<KeyMarker>`.
        let Some(gt) = after.find('>') else { break };
        if !(after.starts_with('>') || after.starts_with(' ') || after.starts_with("/>")) {
            rest = after;
            continue;
        }
        if after[..gt].ends_with('/') {
            out.push("");
            rest = &after[gt + 1..];
            continue;
        }
        let inner = &after[gt + 1..];
        let Some(end) = inner.find(&close) else { break };
        out.push(&inner[..end]);
        rest = &inner[end + close.len()..];
    }
    out
}

/// XML's five entities and numeric references.
pub(crate) fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let Some(semi) = after.find(';') else {
            out.push_str(after);
            return out;
        };
        let entity = &after[1..semi];
        let c = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e if e.starts_with("#x") => u32::from_str_radix(&e[2..], 16)
                .ok()
                .and_then(char::from_u32),
            e if e.starts_with('#') => e[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match c {
            Some(c) => out.push(c),
            None => out.push_str(&after[..=semi]),
        }
        rest = &after[semi + 1..];
    }
    out.push_str(rest);
    out
}

/// `Code: Message` of an error answer, or its start.
pub(crate) fn error_text(body: &str) -> String {
    match (first(body, "Code"), first(body, "Message")) {
        (Some(c), Some(m)) => format!("{}: {}", unescape(c), unescape(m)),
        (Some(c), None) => unescape(c),
        _ => body.chars().take(200).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_list_answers() {
        let x = r#"<?xml version="1.0"?><ListBucketResult><KeyCount>2</KeyCount>
            <Contents><Key>m/a&amp;b.json</Key><Size>3</Size></Contents>
            <Contents><Key>m/c</Key><Size>0</Size><Owner/></Contents>
            <IsTruncated>false</IsTruncated></ListBucketResult>"#;
        let keys: Vec<String> = all(x, "Key").into_iter().map(unescape).collect();
        assert_eq!(keys, ["m/a&b.json", "m/c"]);
        assert_eq!(first(x, "IsTruncated"), Some("false"));
        assert_eq!(first(x, "Owner"), Some(""));
        assert_eq!(unescape("&#x41;&#66;&lt;&unknown;"), "AB<&unknown;");
        assert_eq!(
            error_text("<Error><Code>NoSuchBucket</Code><Message>gone</Message></Error>"),
            "NoSuchBucket: gone"
        );
    }
}
