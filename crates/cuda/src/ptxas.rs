//! The per-function facts in ptxas's verbose report (`-Xptxas=-v`), which NVRTC returns in
//! its program log:
//!
//! ```text
//! ptxas info    : Compiling entry function 'add' for 'sm_90'
//! ptxas info    : Function properties for add
//! ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ptxas info    : Used 18 registers, used 1 barriers, 128 bytes smem
//! ptxas info    : Function properties for _Z6helperf
//! ptxas         .     32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ```

use std::fmt::Write as _;

/// What ptxas reports for one function: a kernel (entry) or a non-inlined device function.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionReport {
    pub name: String,
    /// A `__global__` kernel; device functions report only their stack and spills.
    pub entry: bool,
    pub registers: Option<u32>,
    pub stack_frame_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    /// Static shared memory per block.
    pub shared_mem_bytes: u32,
}

impl FunctionReport {
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// The functions of a ptxas report, in the order it lists them.
pub fn parse(log: &str) -> Vec<FunctionReport> {
    let mut out: Vec<FunctionReport> = Vec::new();
    // Index of the kernel being compiled ("Used …" lines), and of the function whose
    // properties the next "." line gives.
    let mut entry: Option<usize> = None;
    let mut properties: Option<usize> = None;
    for line in log.lines() {
        let Some(rest) = line.strip_prefix("ptxas") else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(info) = rest.strip_prefix("info") {
            let info = info.trim_start().trim_start_matches(':').trim();
            if let Some(name) = info
                .strip_prefix("Compiling entry function '")
                .and_then(|r| r.split('\'').next())
            {
                let i = find_or_add(&mut out, name);
                out[i].entry = true;
                entry = Some(i);
            } else if let Some(name) = info.strip_prefix("Function properties for ") {
                properties = Some(find_or_add(&mut out, name.trim()));
            } else if let Some(used) = info.strip_prefix("Used ")
                && let Some(f) = entry.map(|i| &mut out[i])
            {
                f.registers = number_before(used, "registers");
                f.shared_mem_bytes = number_before(used, "bytes smem").unwrap_or(0);
            }
        } else if let Some(props) = rest.strip_prefix('.')
            && let Some(f) = properties.take().map(|i| &mut out[i])
        {
            f.stack_frame_bytes = number_before(props, "bytes stack frame").unwrap_or(0);
            f.spill_store_bytes = number_before(props, "bytes spill stores").unwrap_or(0);
            f.spill_load_bytes = number_before(props, "bytes spill loads").unwrap_or(0);
        }
    }
    out
}

fn find_or_add(out: &mut Vec<FunctionReport>, name: &str) -> usize {
    if let Some(i) = out.iter().position(|f| f.name == name) {
        return i;
    }
    out.push(FunctionReport {
        name: name.to_string(),
        ..Default::default()
    });
    out.len() - 1
}

/// The number that starts the comma-separated item ending in `unit`: `"18"` in
/// `"18 registers, used 1 barriers"` for `"registers"`.
fn number_before(list: &str, unit: &str) -> Option<u32> {
    list.split(',')
        .map(str::trim)
        .find_map(|item| item.strip_suffix(unit))
        .and_then(|n| n.trim().parse().ok())
}

/// One row of [`table`]: a function of one file compiled for one architecture.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    pub file: &'a str,
    pub arch: String,
    pub function: &'a FunctionReport,
}

/// A fixed-width table of registers, stack, spills and shared memory per function.
pub fn table(rows: &[Row<'_>]) -> String {
    let name_width = rows
        .iter()
        .map(|r| r.function.name.len() + if r.function.entry { 0 } else { 9 })
        .chain([8])
        .max()
        .unwrap_or(8);
    let file_width = rows
        .iter()
        .map(|r| r.file.len())
        .chain([4])
        .max()
        .unwrap_or(4);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<file_width$}  {:<6}  {:<name_width$}  {:>4}  {:>6}  {:>12}  {:>11}  {:>6}",
        "file", "arch", "function", "regs", "stack", "spill stores", "spill loads", "smem"
    );
    for r in rows {
        let f = r.function;
        let name = if f.entry {
            f.name.clone()
        } else {
            format!("{} (device)", f.name)
        };
        let regs = f.registers.map_or("-".to_string(), |n| n.to_string());
        let _ = writeln!(
            s,
            "{:<file_width$}  {:<6}  {:<name_width$}  {:>4}  {:>6}  {:>12}  {:>11}  {:>6}",
            r.file,
            r.arch,
            name,
            regs,
            f.stack_frame_bytes,
            f.spill_store_bytes,
            f.spill_load_bytes,
            f.shared_mem_bytes
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    // Verbatim from NVRTC 13.5 (sm_90): a kernel calling a non-inlined device function, then a
    // kernel with shared memory.
    const LOG: &str = "ptxas info    : 0 bytes gmem\n\
        ptxas info    : Compiling entry function 'h' for 'sm_90'\n\
        ptxas info    : Function properties for h\n\
        ptxas         .     32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
        ptxas info    : Used 16 registers, used 0 barriers, 32 bytes cumulative stack size\n\
        ptxas info    : Compile time = 35.937 ms\n\
        ptxas info    : Function properties for _Z6helperf\n\
        ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
        ptxas info    : Compiling entry function 'add' for 'sm_90'\n\
        ptxas info    : Function properties for add\n\
        ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
        ptxas info    : Used 18 registers, used 1 barriers, 128 bytes smem\n\
        ptxas info    : Compile time = 4.885 ms\n";

    #[test]
    fn kernels_and_device_functions_are_reported() {
        let r = parse(LOG);
        assert_eq!(r.len(), 3, "{r:?}");
        assert_eq!(
            r[0],
            FunctionReport {
                name: "h".into(),
                entry: true,
                registers: Some(16),
                stack_frame_bytes: 32,
                ..Default::default()
            }
        );
        assert_eq!(r[1].name, "_Z6helperf");
        assert!(!r[1].entry);
        assert_eq!(r[1].registers, None);
        assert_eq!(r[2].name, "add");
        assert_eq!(r[2].registers, Some(18));
        assert_eq!(r[2].shared_mem_bytes, 128);
        assert!(!r.iter().any(FunctionReport::spills));
    }

    #[test]
    fn spills_and_the_sm80_format_are_read() {
        let log = "ptxas info    : Compiling entry function 'spill' for 'sm_80'\n\
            ptxas info    : Function properties for spill\n\
            ptxas         .     440 bytes stack frame, 508 bytes spill stores, 624 bytes spill loads\n\
            ptxas info    : Used 32 registers, used 0 barriers, 440 bytes cumulative stack size, 368 bytes cmem[0]\n";
        let r = parse(log);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].registers, Some(32));
        assert_eq!(r[0].stack_frame_bytes, 440);
        assert_eq!(r[0].spill_store_bytes, 508);
        assert_eq!(r[0].spill_load_bytes, 624);
        assert!(r[0].spills());
    }

    #[test]
    fn front_end_errors_parse_to_nothing() {
        assert!(parse("t.cu(1): error: expected an expression\n").is_empty());
    }

    #[test]
    fn the_table_has_a_row_per_function() {
        let r = parse(LOG);
        let rows: Vec<Row> = r
            .iter()
            .map(|f| Row {
                file: "t.cu",
                arch: "sm_90".into(),
                function: f,
            })
            .collect();
        let t = table(&rows);
        assert_eq!(t.lines().count(), 4, "{t}");
        assert!(t.contains("_Z6helperf (device)"), "{t}");
        let add = t.lines().find(|l| l.contains(" add ")).expect("add row");
        assert!(add.contains("18") && add.ends_with("128"), "{add}");
    }
}
