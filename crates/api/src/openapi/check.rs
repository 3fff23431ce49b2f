//! A validator for the subset of OpenAPI 3.0 schema objects the document uses (`$ref`, `type`
//! with `nullable`, `properties`, `required`, `additionalProperties`, `items`, `enum`,
//! `allOf`/`oneOf`/`anyOf`, numeric and length bounds), so tests can check the formatters' output
//! against the document without a schema library.

use serde_json::Value;

/// Checks `value` against `schema`, resolving `$ref`s in `doc`. The error names the path.
pub fn validate(doc: &Value, schema: &Value, value: &Value) -> Result<(), String> {
    at(doc, schema, value, "$")
}

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> Result<&'a Value, String> {
    match schema.get("$ref").and_then(Value::as_str) {
        None => Ok(schema),
        Some(r) => {
            let path = r
                .strip_prefix("#/")
                .ok_or_else(|| format!("unsupported $ref {r}"))?;
            let mut cur = doc;
            for part in path.split('/') {
                cur = cur.get(part).ok_or_else(|| format!("dangling $ref {r}"))?;
            }
            resolve(doc, cur)
        }
    }
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => false,
    }
}

fn at(doc: &Value, schema: &Value, v: &Value, path: &str) -> Result<(), String> {
    let s = resolve(doc, schema)?;
    if v.is_null() && s.get("nullable").and_then(Value::as_bool) == Some(true) {
        return Ok(());
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for part in all {
            at(doc, part, v, path)?;
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = s.get(key).and_then(Value::as_array) {
            let errors: Vec<String> = options
                .iter()
                .filter_map(|o| at(doc, o, v, path).err())
                .collect();
            let matched = options.len() - errors.len();
            let ok = if key == "oneOf" {
                matched == 1
            } else {
                matched >= 1
            };
            if !ok {
                return Err(format!(
                    "{path}: {matched} of the {key} options match ({})",
                    errors.join("; ")
                ));
            }
        }
    }
    if let Some(t) = s.get("type").and_then(Value::as_str)
        && !type_ok(t, v)
    {
        return Err(format!("{path}: expected {t}, got {v}"));
    }
    if let Some(options) = s.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        return Err(format!("{path}: {v} is not one of {options:?}"));
    }
    if let Some(n) = v.as_f64() {
        let exclusive = s.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
        if let Some(min) = s.get("minimum").and_then(Value::as_f64)
            && (n < min || exclusive && n == min)
        {
            return Err(format!("{path}: {n} < minimum {min}"));
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64)
            && n > max
        {
            return Err(format!("{path}: {n} > maximum {max}"));
        }
    }
    if let Some(obj) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        if let Some(req) = s.get("required").and_then(Value::as_array) {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    return Err(format!("{path}: missing required property {r:?}"));
                }
            }
        }
        for (k, item) in obj {
            let p = format!("{path}.{k}");
            match props.and_then(|p| p.get(k)) {
                Some(ps) => at(doc, ps, item, &p)?,
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{path}: unexpected property {k:?}"));
                    }
                    Some(extra @ Value::Object(_)) => at(doc, extra, item, &p)?,
                    _ => {}
                },
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            at(doc, items, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks_types_required_refs_and_alternatives() {
        let doc = json!({"components": {"schemas": {"T": {"type": "object", "required": ["id"],
            "additionalProperties": false,
            "properties": {"id": {"type": "integer", "minimum": 0}, "t": {"type": "string", "nullable": true}}}}}});
        let t = json!({"$ref": "#/components/schemas/T"});
        assert!(validate(&doc, &t, &json!({"id": 1, "t": null})).is_ok());
        assert!(validate(&doc, &t, &json!({"id": -1})).is_err());
        assert!(validate(&doc, &t, &json!({"t": "x"})).is_err());
        assert!(validate(&doc, &t, &json!({"id": 1, "x": 0})).is_err());
        let list = json!({"type": "array", "items": {"oneOf": [{"type": "string"}, t]}});
        assert!(validate(&doc, &list, &json!(["a", {"id": 2}])).is_ok());
        assert!(validate(&doc, &list, &json!([1.5])).is_err());
    }
}
