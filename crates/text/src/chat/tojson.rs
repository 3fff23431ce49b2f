//! The `tojson` filter as transformers defines it for chat templates: Python's `json.dumps`
//! with `ensure_ascii=False`. minijinja's own filter escapes `<`, `>`, `&` and `'` for HTML,
//! which would change the tool descriptions a model sees (`user's` -> `user\u0027s`).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Python's `json.dumps` layout options.
struct Style {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `x | tojson`, `tojson(indent=4)`, `tojson(ensure_ascii=..., separators=..., sort_keys=...)`.
/// A positional argument is the indent, as in Jinja2's filter.
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(seps) => match <[String; 2]>::try_from(seps) {
            Ok([item, key]) => (item, key),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair (item, key)",
                ));
            }
        },
        // Python drops the space after "," when indenting.
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = Style {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_value(out: &mut String, v: &Value, style: &Style, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            let mut items = Vec::with_capacity(keys.len());
            for key in keys {
                let val = v.get_item(&key)?;
                // JSON keys are strings; Python converts numbers the same way.
                let key = key.as_str().map_or_else(|| key.to_string(), str::to_owned);
                items.push((Some(key), val));
            }
            write_container(out, ('{', '}'), items, style, level)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items = v.try_iter()?.map(|item| (None, item)).collect();
            write_container(out, ('[', ']'), items, style, level)
        }
        ValueKind::String => {
            write_string(out, v.as_str().unwrap_or_default(), style.ensure_ascii);
            Ok(())
        }
        ValueKind::Undefined | ValueKind::None => {
            out.push_str("null");
            Ok(())
        }
        ValueKind::Bool => {
            out.push_str(if v.is_true() { "true" } else { "false" });
            Ok(())
        }
        ValueKind::Number => {
            out.push_str(&number_text(v));
            Ok(())
        }
        // Bytes and opaque objects: Python would refuse; their text is the useful fallback.
        _ => {
            write_string(out, &v.to_string(), style.ensure_ascii);
            Ok(())
        }
    }
}

/// Integers as they are; floats keep a fraction (`1.0`), as Python prints them.
fn number_text(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    match serde_json::Number::from_f64(f) {
        Some(n) => n.to_string(),
        None if f.is_nan() => "NaN".to_owned(),
        None if f > 0.0 => "Infinity".to_owned(),
        None => "-Infinity".to_owned(),
    }
}

fn write_container(
    out: &mut String,
    (open, close): (char, char),
    items: Vec<(Option<String>, Value)>,
    style: &Style,
    level: usize,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, (key, val)) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, style, level + 1);
        if let Some(key) = key {
            write_string(out, key, style.ensure_ascii);
            out.push_str(&style.key_sep);
        }
        write_value(out, val, style, level + 1)?;
    }
    newline(out, style, level);
    out.push(close);
    Ok(())
}

fn newline(out: &mut String, style: &Style, level: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        out.push_str(&indent.repeat(level));
    }
}

/// serde_json escapes exactly what Python escapes with `ensure_ascii=False`.
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    let quoted = serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""));
    if !ensure_ascii {
        out.push_str(&quoted);
        return;
    }
    for c in quoted.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use minijinja::{Environment, context};

    fn render(src: &str, value: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        let x = crate::chat::jinja::json_value(&value);
        env.render_str(src, context! { x }).unwrap()
    }

    // Expected strings are what CPython's json.dumps prints for the same value: keys in the
    // order written, as a Python dict keeps them.
    #[test]
    fn matches_python_json_dumps() {
        let v = serde_json::json!({"b": [1, 2.5, 1.0, true, null], "a": "it's <b> & é\n", "c": {}});
        assert_eq!(
            render("{{ x | tojson }}", v.clone()),
            r#"{"b": [1, 2.5, 1.0, true, null], "a": "it's <b> & é\n", "c": {}}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", v.clone()),
            "{\n  \"b\": [\n    1,\n    2.5,\n    1.0,\n    true,\n    null\n  ],\n  \"a\": \"it's <b> & é\\n\",\n  \"c\": {}\n}"
        );
        assert_eq!(
            render(
                "{{ x | tojson(ensure_ascii=True, separators=[',', ':'], sort_keys=True) }}",
                v
            ),
            r#"{"a":"it's <b> & \u00e9\n","b":[1,2.5,1.0,true,null],"c":{}}"#
        );
    }

    #[test]
    fn unknown_argument_is_an_error() {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        assert!(
            env.render_str("{{ 1 | tojson(width=3) }}", context! {})
                .is_err()
        );
    }
}
