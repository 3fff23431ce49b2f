//! One Prometheus exposition from several models' (each model keeps its own registry, so its
//! counters follow its own scheduler): every sample gains a `model` label, and each family's
//! `# HELP` / `# TYPE` appears once, its samples from every model under it.

/// `parts`: (model name, that model's exposition text).
pub fn merge(parts: &[(String, String)]) -> String {
    // Families in first-seen order: (header lines, samples).
    let mut order: Vec<String> = Vec::new();
    let mut families: std::collections::HashMap<String, (Vec<String>, Vec<String>)> =
        std::collections::HashMap::new();
    for (model, text) in parts {
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
            {
                let fam = rest.split(' ').next().unwrap_or_default().to_string();
                let entry = families.entry(fam.clone()).or_insert_with(|| {
                    order.push(fam.clone());
                    (Vec::new(), Vec::new())
                });
                if !entry.0.iter().any(|h| h == line) {
                    entry.0.push(line.to_string());
                }
                current = fam;
            } else if line.starts_with('#') || line.trim().is_empty() {
                continue;
            } else {
                let labelled = with_model(line, model);
                let entry = families.entry(current.clone()).or_insert_with(|| {
                    order.push(current.clone());
                    (Vec::new(), Vec::new())
                });
                entry.1.push(labelled);
            }
        }
    }
    let mut out = String::new();
    for fam in order {
        if let Some((heads, samples)) = families.get(&fam) {
            for l in heads.iter().chain(samples) {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

/// `name{a="b"} 1` → `name{model="m",a="b"} 1`; `name 1` → `name{model="m"} 1`.
fn with_model(line: &str, model: &str) -> String {
    let escaped = model.replace('\\', "\\\\").replace('"', "\\\"");
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, rest) = line.split_at(name_end);
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{name}{{model=\"{escaped}\"{labels}"),
        Some(labels) => format!("{name}{{model=\"{escaped}\",{labels}"),
        None => format!("{name}{{model=\"{escaped}\"}}{rest}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_gain_a_model_label_and_families_appear_once() {
        let a = "# HELP x X.\n# TYPE x counter\nx 1\n# HELP y Y.\n# TYPE y gauge\ny{k=\"v\"} 2\n";
        let b = "# HELP x X.\n# TYPE x counter\nx 3\n";
        let m = merge(&[("a".into(), a.into()), ("b".into(), b.into())]);
        assert_eq!(
            m,
            "# HELP x X.\n# TYPE x counter\nx{model=\"a\"} 1\nx{model=\"b\"} 3\n\
             # HELP y Y.\n# TYPE y gauge\ny{model=\"a\",k=\"v\"} 2\n"
        );
    }
}
