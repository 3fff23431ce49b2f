//! `cargo run --release -p lmi-engine-cpu --example amxcontend`: whether AMX tile products and
//! AVX-512 arithmetic overlap on this CPU. Times a loop of two `tdpbsud`, one of 64 FMAs on
//! 512-bit (or 256-bit) registers, and one of both. The lane kernels' tile path needs four
//! f32 operations per output and block of 32 after each tile product (the exact-bits
//! definition in `qlanes`); if the units overlapped, that work would hide behind the tiles.
//! On the Xeon of docs/benchmarks.md it does not: with products in flight the vector units
//! deliver about half their lanes (512-bit or 256-bit alike).
#[cfg(target_arch = "x86_64")]
fn main() {
    use std::arch::asm;

    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if !cpuinfo.contains("amx_int8") || !std::arch::is_x86_feature_detected!("avx512f") {
        println!("no AMX-INT8 (or no AVX-512) on this CPU: nothing to measure");
        return;
    }
    // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux grants the tile state.
    let granted: i64;
    unsafe {
        asm!("syscall", inlateout("rax") 158i64 => granted, in("rdi") 0x1023i64,
             in("rsi") 18i64, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    if granted != 0 {
        println!("the kernel refused the AMX tile state ({granted})");
        return;
    }
    // Palette 1, tiles 0-7 all 16 rows of 64 bytes.
    let mut cfg = [0u8; 64];
    cfg[0] = 1;
    for t in 0..8 {
        cfg[16 + 2 * t] = 64;
        cfg[48 + t] = 16;
    }
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack)) };

    // SAFETY: AVX-512F is present (checked above) and the tiles are configured.
    unsafe { measure() };
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Times each loop; the tiles are configured and the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn measure() {
    use std::arch::asm;
    use std::arch::x86_64::{_mm512_set1_ps, _mm512_setzero_ps};
    use std::time::Instant;

    const N: u32 = 2_000_000;
    macro_rules! tdp2 {
        () => {
            "tdpbsud tmm0, tmm4, tmm6\ntdpbsud tmm1, tmm5, tmm7\n"
        };
    }
    macro_rules! fma8 {
        ($r:literal) => {
            concat!(
                "vfmadd231ps ",
                $r,
                "2, ",
                $r,
                "0, ",
                $r,
                "1\n",
                "vfmadd231ps ",
                $r,
                "3, ",
                $r,
                "0, ",
                $r,
                "1\n",
                "vfmadd231ps ",
                $r,
                "4, ",
                $r,
                "0, ",
                $r,
                "1\n",
                "vfmadd231ps ",
                $r,
                "5, ",
                $r,
                "0, ",
                $r,
                "1\n",
                "vfmadd231ps ",
                $r,
                "6, ",
                $r,
                "0, ",
                $r,
                "1\n",
                "vfmadd231ps ",
                $r,
                "7, ",
                $r,
                "0, ",
                $r,
                "1\n",
                "vfmadd231ps ",
                $r,
                "8, ",
                $r,
                "0, ",
                $r,
                "1\n",
                "vfmadd231ps ",
                $r,
                "9, ",
                $r,
                "0, ",
                $r,
                "1\n",
            )
        };
    }
    macro_rules! fma64 {
        ($r:literal) => {
            concat!(
                fma8!($r),
                fma8!($r),
                fma8!($r),
                fma8!($r),
                fma8!($r),
                fma8!($r),
                fma8!($r),
                fma8!($r)
            )
        };
    }
    macro_rules! time {
        ($name:expr, $s:expr) => {{
            let (one, z) = (_mm512_set1_ps(1.0), _mm512_setzero_ps());
            let t0 = Instant::now();
            for _ in 0..N {
                // SAFETY: register-only arithmetic on the configured tiles and on vector
                // registers declared here.
                unsafe {
                    asm!($s, in("zmm0") one, in("zmm1") one,
                         inout("zmm2") z => _, inout("zmm3") z => _, inout("zmm4") z => _,
                         inout("zmm5") z => _, inout("zmm6") z => _, inout("zmm7") z => _,
                         inout("zmm8") z => _, inout("zmm9") z => _, options(nostack, nomem))
                }
            }
            println!("{:<28} {:6.2} ns", $name, t0.elapsed().as_secs_f64() * 1e9 / f64::from(N));
        }};
    }
    time!("(warm-up)", concat!(tdp2!(), fma64!("zmm")));
    time!("2 tdpbsud", tdp2!());
    time!("64 FMA zmm", fma64!("zmm"));
    time!("2 tdpbsud + 64 FMA zmm", concat!(tdp2!(), fma64!("zmm")));
    // The same lanes on 256-bit registers.
    time!("128 FMA ymm", concat!(fma64!("ymm"), fma64!("ymm")));
    time!(
        "2 tdpbsud + 128 FMA ymm",
        concat!(tdp2!(), fma64!("ymm"), fma64!("ymm"))
    );
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86-64 only");
}
