//! serving.properties: Java-properties style `key=value` lines (`key: value` and `key value`
//! too), `#`/`!` comments, blank lines ignored. Keys keep their case (`option.entryPoint`).

use std::path::Path;

use anyhow::Context;

/// Parses the text of a serving.properties file into (key, value) pairs, in file order.
pub fn parse(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for raw in text.lines() {
        let line = raw.trim_start();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!'))
        {
            continue;
        }
        // A trailing backslash continues the logical line.
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        let logical = std::mem::take(&mut pending);
        if let Some(kv) = split_pair(&logical) {
            out.push(kv);
        }
    }
    if !pending.is_empty()
        && let Some(kv) = split_pair(&pending)
    {
        out.push(kv);
    }
    out
}

fn split_pair(line: &str) -> Option<(String, String)> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    let sep = line
        .find(['=', ':'])
        .or_else(|| line.find(char::is_whitespace));
    let (key, value) = match sep {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, ""),
    };
    Some((key.trim().to_string(), value.trim().to_string()))
}

/// Reads and parses a serving.properties file.
pub fn read(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading serving.properties {}", path.display()))?;
    Ok(parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_separators_comments_and_continuations() {
        let text = "# comment\n! also comment\n\noption.model_id = /opt/ml/model/x\n\
                    engine: Python\noption.rolling_batch auto\noption.adapters=a=/p/a,\\\n  b=/p/b\n\
                    option.empty=\n";
        let got = parse(text);
        assert_eq!(
            got,
            vec![
                ("option.model_id".into(), "/opt/ml/model/x".into()),
                ("engine".into(), "Python".into()),
                ("option.rolling_batch".into(), "auto".into()),
                ("option.adapters".into(), "a=/p/a,b=/p/b".into()),
                ("option.empty".into(), "".into()),
            ]
        );
    }
}
