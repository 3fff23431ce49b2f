//! Typed reads of JSON object fields with errors that name the field, e.g.
//! "parameters.temperature must be a number, got string". `null` always reads as absent.

use crate::error::ApiError;
use serde_json::{Map, Value};

pub(crate) type Res<T> = Result<T, ApiError>;

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A view on one JSON object; `prefix` is prepended to field names in messages.
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>, prefix: &'a str) -> Self {
        Self { map, prefix }
    }

    /// The top level of a request body, which must be a JSON object.
    pub fn body(body: &'a Value) -> Res<Self> {
        let map = body.as_object().ok_or_else(|| {
            ApiError::invalid_body(format!(
                "request body must be a JSON object, got {}",
                type_name(body)
            ))
        })?;
        Ok(Self::new(map, ""))
    }

    pub fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    /// The value, with `null` read as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    /// The first of `keys` that is present and not null (aliases).
    pub fn first_key(&self, keys: &[&'static str]) -> Option<&'static str> {
        keys.iter().copied().find(|k| self.get(k).is_some())
    }

    pub fn type_err(&self, key: &str, want: &str, v: &Value) -> ApiError {
        let path = self.path(key);
        ApiError::invalid_body(format!("{path} must be {want}, got {}", type_name(v)))
            .with_param(path)
    }

    /// A range/consistency error on `key`.
    pub fn range_err(&self, key: &str, msg: impl std::fmt::Display) -> ApiError {
        let path = self.path(key);
        ApiError::validation(format!("{path} {msg}")).with_param(path)
    }

    pub fn f64(&self, key: &str) -> Res<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(self.type_err(key, "a number", v)),
        }
    }

    pub fn f32(&self, key: &str) -> Res<Option<f32>> {
        Ok(self.f64(key)?.map(|v| v as f32))
    }

    /// An integer; a float with no fractional part (`30.0`) is accepted as Python does.
    pub fn i64(&self, key: &str) -> Res<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    Ok(Some(i))
                } else if let Some(u) = n.as_u64() {
                    Ok(Some(i64::try_from(u).unwrap_or(i64::MAX)))
                } else {
                    match n.as_f64() {
                        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
                        _ => Err(self.range_err(key, format!("must be an integer, got {n}"))),
                    }
                }
            }
            Some(v) => Err(self.type_err(key, "an integer", v)),
        }
    }

    /// A u64 (seeds); negative values are rejected.
    pub fn u64(&self, key: &str) -> Res<Option<u64>> {
        match self.get(key) {
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
            Some(_) => match self.i64(key)? {
                Some(i) if i < 0 => {
                    Err(self.range_err(key, format!("must be a non-negative integer, got {i}")))
                }
                other => Ok(other.map(|i| i as u64)),
            },
            None => Ok(None),
        }
    }

    /// An integer in `[min, max]`, returned as i64.
    pub fn int_in(&self, key: &str, min: i64, max: i64, what: &str) -> Res<Option<i64>> {
        match self.i64(key)? {
            Some(i) if i < min || i > max => {
                Err(self.range_err(key, format!("must be {what}, got {i}")))
            }
            other => Ok(other),
        }
    }

    pub fn bool(&self, key: &str) -> Res<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.type_err(key, "a boolean", v)),
        }
    }

    pub fn str(&self, key: &str) -> Res<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.type_err(key, "a string", v)),
        }
    }

    /// A string or an array of strings.
    pub fn strings(&self, key: &str) -> Res<Option<Vec<String>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(self.type_err(&format!("{key}[{i}]"), "a string", other)),
                })
                .collect::<Res<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.type_err(key, "a string or an array of strings", v)),
        }
    }

    /// An array of token ids.
    pub fn ids(&self, key: &str) -> Res<Option<Vec<u32>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| token_id(v).ok_or_else(|| self.id_err(&format!("{key}[{i}]"), v)))
                .collect::<Res<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.type_err(key, "an array of token ids", v)),
        }
    }

    pub fn id_err(&self, key: &str, v: &Value) -> ApiError {
        let path = self.path(key);
        ApiError::invalid_body(format!(
            "{path} must be a token id (integer 0..=4294967295), got {v}"
        ))
        .with_param(path)
    }

    pub fn object(&self, key: &str) -> Res<Option<&'a Map<String, Value>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(self.type_err(key, "an object", v)),
        }
    }

    /// Keys not in `known`, in body order, so the server can log them (LMI drops them with a warning).
    /// In name order, whatever the map's order (serde_json's `preserve_order` is switched on by
    /// some dependencies, which would otherwise change the report).
    pub fn unknown(&self, known: &[&str]) -> Vec<String> {
        let mut names: Vec<String> = self
            .map
            .keys()
            .filter(|k| !known.contains(&k.as_str()))
            .cloned()
            .collect();
        names.sort();
        names
    }
}

pub(crate) fn token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|u| u32::try_from(u).ok())
}
