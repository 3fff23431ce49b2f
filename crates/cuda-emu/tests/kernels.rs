//! The emulator runs the self-test kernels of test_kernels/ with CUDA's semantics: built-ins,
//! shared memory, common.cuh's reductions, warp intrinsics, atomics, and both thread orders.

use lmi_cuda::device::Pod;
use lmi_cuda::{Arg, DevPtr, Device, DeviceExt, LaunchConfig};
use lmi_cuda_emu::{BlockOrder, EmuDevice, ThreadOrder};

fn upload<T: Pod>(d: &EmuDevice, v: &[T]) -> DevPtr {
    let p = d.alloc(std::mem::size_of_val(v)).unwrap();
    d.htod_slice(v, p).unwrap();
    p
}

fn run(d: &EmuDevice, name: &str, cfg: LaunchConfig, args: &[Arg]) {
    let f = d.function(name).unwrap();
    d.launch(f, &cfg, args).unwrap();
}

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid,
        block,
        shared_mem_bytes: 0,
    }
}

#[test]
fn builtins_for_1d_2d_3d_grids_and_blocks() {
    let d = EmuDevice::new();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        d.set_block_order(order);
        for (grid, block) in [
            ((3, 1, 1), (64, 1, 1)),
            ((2, 3, 1), (8, 4, 1)),
            ((2, 2, 3), (4, 3, 5)),
            ((1, 1, 1), (1, 1, 1)),
            ((5, 1, 2), (1024, 1, 1)),
        ] {
            let blocks = grid.0 * grid.1 * grid.2;
            let threads = block.0 * block.1 * block.2;
            let n = (blocks * threads * 12) as usize;
            let out = d.alloc(n * 4).unwrap();
            run(&d, "emu_builtins", cfg(grid, block), &[out.into()]);
            let v: Vec<u32> = d.dtoh_vec(out, n).unwrap();
            for bz in 0..grid.2 {
                for by in 0..grid.1 {
                    for bx in 0..grid.0 {
                        for tz in 0..block.2 {
                            for ty in 0..block.1 {
                                for tx in 0..block.0 {
                                    let b = bx + grid.0 * (by + grid.1 * bz);
                                    let t = tx + block.0 * (ty + block.1 * tz);
                                    let i = ((b * threads + t) * 12) as usize;
                                    let want = [
                                        tx, ty, tz, bx, by, bz, block.0, block.1, block.2, grid.0,
                                        grid.1, grid.2,
                                    ];
                                    assert_eq!(
                                        &v[i..i + 12],
                                        &want,
                                        "grid {grid:?} block {block:?}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
            d.free(out);
        }
    }
}

#[test]
fn static_shared_memory_reverse_in_both_orders() {
    let d = EmuDevice::new();
    let n = 4 * 256;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let xp = upload(&d, &x);
    let yp = d.alloc(n * 4).unwrap();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        run(
            &d,
            "emu_reverse_static",
            LaunchConfig::linear(4, 256),
            &[xp.into(), yp.into()],
        );
        let y: Vec<f32> = d.dtoh_vec(yp, n).unwrap();
        for b in 0..4 {
            for t in 0..256 {
                assert_eq!(y[b * 256 + t], x[b * 256 + 255 - t], "{order:?}");
            }
        }
    }
}

#[test]
fn a_missing_syncthreads_shows_in_one_of_the_two_orders() {
    let d = EmuDevice::new();
    let n = 2 * 256;
    let x: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
    let xp = upload(&d, &x);
    let yp = d.alloc(n * 4).unwrap();
    let want: Vec<f32> = (0..n).map(|i| x[(i / 256) * 256 + 255 - i % 256]).collect();
    let mut results = Vec::new();
    for kernel in ["emu_reverse_static", "emu_reverse_racy"] {
        for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
            d.set_thread_order(order);
            d.memset_zero(yp, n * 4).unwrap();
            run(
                &d,
                kernel,
                LaunchConfig::linear(2, 256),
                &[xp.into(), yp.into()],
            );
            let y: Vec<f32> = d.dtoh_vec(yp, n).unwrap();
            results.push((kernel, order, y == want));
        }
    }
    assert!(
        results[0].2 && results[1].2,
        "the correct kernel passes in both orders: {results:?}"
    );
    assert!(
        !(results[2].2 && results[3].2),
        "the racy kernel fails in at least one order: {results:?}"
    );
}

#[test]
fn dynamic_shared_memory_is_poisoned_aligned_and_per_launch_sized() {
    let d = EmuDevice::new();
    let (blocks, threads) = (3usize, 128usize);
    let n = blocks * threads;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let xp = upload(&d, &x);
    let yp = d.alloc(n * 4).unwrap();
    let poison = d.alloc(n * 4).unwrap();
    let align = d.alloc(blocks * 4).unwrap();
    let f = d.function("emu_reverse_dynamic").unwrap();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        let cfg =
            LaunchConfig::linear(blocks as u32, threads as u32).with_shared(threads as u32 * 4);
        d.launch(
            f,
            &cfg,
            &[xp.into(), yp.into(), poison.into(), align.into()],
        )
        .unwrap();
        let y: Vec<f32> = d.dtoh_vec(yp, n).unwrap();
        for i in 0..n {
            assert_eq!(y[i], x[(i / threads) * threads + threads - 1 - i % threads]);
        }
        // every block starts from poison, not from the previous block's data
        let p: Vec<u32> = d.dtoh_vec(poison, n).unwrap();
        assert!(p.iter().all(|&v| v == 0xffff_ffff), "{:x?}", &p[..4]);
        let a: Vec<u32> = d.dtoh_vec(align, blocks).unwrap();
        assert!(
            a.iter().all(|&v| v % 16 == 0),
            "dynamic shared alignment {a:?}"
        );
    }
    // above 48 KiB needs the opt-in, and 227 KiB is the most
    let big = LaunchConfig::linear(1, 128).with_shared(100 * 1024);
    let args = [xp.into(), yp.into(), poison.into(), align.into()];
    let err = d.launch(f, &big, &args).unwrap_err().to_string();
    assert!(err.contains("set_max_dynamic_shared"), "{err}");
    d.set_max_dynamic_shared(f, 100 * 1024).unwrap();
    d.launch(f, &big, &args).unwrap();
    assert!(d.set_max_dynamic_shared(f, 228 * 1024).is_err());
}

#[test]
fn block_sum_and_warp_sum_are_exact_for_every_block_size() {
    let d = EmuDevice::new();
    let out = d.alloc(36 * 4).unwrap();
    let out64 = d.alloc(8).unwrap();
    for threads in (32..=1024).step_by(32) {
        // small integers: every order of summation gives the exact result
        let x: Vec<f32> = (0..threads).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let xp = upload(&d, &x);
        for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
            d.set_thread_order(order);
            d.memset_zero(out, 36 * 4).unwrap();
            run(
                &d,
                "emu_block_sum",
                LaunchConfig::linear(1, threads as u32),
                &[xp.into(), out.into(), out64.into()],
            );
            let o: Vec<f32> = d.dtoh_vec(out, 36).unwrap();
            let o64: Vec<f64> = d.dtoh_vec(out64, 1).unwrap();
            let sum: f32 = x.iter().sum();
            assert_eq!(o[0], sum, "block_sum, {threads} threads");
            assert_eq!(
                o[1],
                2.0 * sum,
                "block_sum with reused scratch, {threads} threads"
            );
            assert_eq!(o64[0], sum as f64, "block_sum<double>, {threads} threads");
            assert_eq!(o[2], 0.0, "every thread gets the block sum");
            for w in 0..threads / 32 {
                let ws: f32 = x[w * 32..w * 32 + 32].iter().sum();
                assert_eq!(o[3 + w], ws, "warp_sum of warp {w}");
            }
            let max = x.iter().cloned().fold(f32::MIN, f32::max);
            assert_eq!(o[35], max, "block_max");
        }
        d.free(xp);
    }
}

/// CUDA's rules for each shuffle, lane by lane.
fn shuffle_reference(n: usize, src: i32, delta: u32, lane_mask: i32, width: i32) -> Vec<f32> {
    let v = |t: usize| t as f32 * 10.0 + 0.5;
    let w = width as usize;
    let mut out = vec![0f32; 4 * n];
    for t in 0..n {
        let (warp, lane) = (t / 32 * 32, t % 32);
        let seg = lane / w * w;
        out[t] = v(warp + seg + (src as usize % w));
        out[n + t] = if lane - seg >= delta as usize {
            v(t - delta as usize)
        } else {
            v(t)
        };
        out[2 * n + t] = if lane - seg + (delta as usize) < w {
            v(t + delta as usize)
        } else {
            v(t)
        };
        let x = lane ^ (lane_mask as usize & 31);
        out[3 * n + t] = if x < seg + w { v(warp + x) } else { v(t) };
    }
    out
}

#[test]
fn every_shuffle_variant_and_width() {
    let d = EmuDevice::new();
    let n = 64;
    let out = d.alloc(4 * n * 4).unwrap();
    for width in [1, 2, 4, 8, 16, 32] {
        for (src, delta, lane_mask) in [(0, 1, 1), (3, 2, 2), (31, 5, 16), (7, 0, 31), (40, 31, 8)]
        {
            for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
                d.set_thread_order(order);
                run(
                    &d,
                    "emu_shuffles",
                    LaunchConfig::linear(1, n as u32),
                    &[
                        out.into(),
                        Arg::I32(src),
                        Arg::U32(delta),
                        Arg::I32(lane_mask),
                        Arg::I32(width),
                    ],
                );
                let got: Vec<f32> = d.dtoh_vec(out, 4 * n).unwrap();
                let want = shuffle_reference(n, src, delta, lane_mask, width);
                assert_eq!(
                    got, want,
                    "width {width} src {src} delta {delta} xor {lane_mask}"
                );
            }
        }
    }
}

#[test]
fn shuffles_of_every_type_and_partial_masks() {
    let d = EmuDevice::new();
    let n = 64usize;
    let out = d.alloc(8 * n * 8).unwrap();
    run(
        &d,
        "emu_shuffle_types",
        LaunchConfig::linear(1, n as u32),
        &[out.into()],
    );
    let o: Vec<u64> = d.dtoh_vec(out, 8 * n).unwrap();
    for t in 0..n {
        let s = t ^ 1;
        let r = &o[8 * t..8 * t + 8];
        assert_eq!(r[0], (s as i32 - 100) as u32 as u64);
        assert_eq!(r[1], s as u64 + 7);
        assert_eq!(r[2], (s as i64 - (1 << 40)) as u64);
        assert_eq!(r[3], s as u64 + (1 << 40));
        assert_eq!(r[4], (s as f32 + 0.25).to_bits() as u64);
        assert_eq!(r[5], (s as f64 + 0.125).to_bits());
        if t % 2 == 0 {
            assert_eq!(r[6], (t ^ 2) as u64, "partial-mask xor");
            assert_eq!(r[7], t as u64, "source outside the mask: own value");
        }
    }
}

#[test]
fn ballot_any_all_match_reduce_and_syncthreads_reductions() {
    let d = EmuDevice::new();
    let n = 64usize;
    let out = d.alloc(4 * n * 4).unwrap();
    for modulus in [1u32, 3, 64] {
        run(
            &d,
            "emu_votes",
            LaunchConfig::linear(1, n as u32),
            &[out.into(), modulus.into()],
        );
        let o: Vec<u32> = d.dtoh_vec(out, 4 * n).unwrap();
        for t in 0..n {
            let warp = t / 32 * 32;
            let ballot = (0..32)
                .filter(|l| ((warp + l) as u32).is_multiple_of(modulus))
                .fold(0u32, |m, l| m | 1 << l);
            assert_eq!(o[4 * t], ballot, "ballot, modulus {modulus}, thread {t}");
            assert_eq!(o[4 * t + 1], (ballot != 0) as u32);
            assert_eq!(o[4 * t + 2], 1);
            assert_eq!(o[4 * t + 3], u32::MAX, "activemask");
        }
    }
    run(
        &d,
        "emu_match_reduce",
        LaunchConfig::linear(1, n as u32),
        &[out.into()],
    );
    let o: Vec<u32> = d.dtoh_vec(out, 4 * n).unwrap();
    for t in 0..n {
        let lane = t % 32;
        assert_eq!(o[4 * t], 0xf << (lane / 4 * 4), "match_any");
        assert_eq!(
            o[4 * t + 1],
            u32::MAX.wrapping_add(1),
            "match_all mask + pred"
        );
        let warp = (t / 32 * 32) as u32;
        assert_eq!(o[4 * t + 2], (warp..warp + 32).sum::<u32>(), "reduce_add");
        assert_eq!(o[4 * t + 3], warp + 31, "reduce_max");
    }
    let r = d.alloc(16).unwrap();
    for modulus in [1u32, 2, 7] {
        run(
            &d,
            "emu_sync_reductions",
            LaunchConfig::linear(1, 100),
            &[r.into(), modulus.into()],
        );
        let o: Vec<i32> = d.dtoh_vec(r, 4).unwrap();
        assert_eq!(
            o,
            vec![
                (0..100u32).filter(|t| t.is_multiple_of(modulus)).count() as i32,
                1,
                1,
                0
            ]
        );
    }
}

#[test]
fn atomics_from_every_thread_of_every_block() {
    let d = EmuDevice::new();
    for order in [BlockOrder::Forward, BlockOrder::Reverse] {
        d.set_block_order(order);
        let i = upload(&d, &[0i32, 0, i32::MIN, i32::MAX]);
        let u = upload(&d, &[0u32, 0, u32::MAX, 0, 0, u32::MAX, 0, 0]);
        let ull = upload(&d, &[0u64, 0]);
        let f = upload(&d, &[0f32]);
        let dd = upload(&d, &[0f64]);
        let (blocks, threads) = (3u32, 96u32);
        let total = blocks * threads;
        run(
            &d,
            "emu_atomics",
            LaunchConfig::linear(blocks, threads),
            &[i.into(), u.into(), ull.into(), f.into(), dd.into()],
        );
        let iv: Vec<i32> = d.dtoh_vec(i, 4).unwrap();
        assert_eq!(
            iv,
            vec![
                total as i32,
                -2 * total as i32,
                total as i32 - 1,
                -(total as i32 - 1)
            ]
        );
        let uv: Vec<u32> = d.dtoh_vec(u, 8).unwrap();
        assert_eq!(
            uv,
            vec![
                3 * total,
                u32::MAX,
                0xffff_0000,
                total % 2,
                total - 1,
                10,
                total,
                42
            ]
        );
        let ullv: Vec<u64> = d.dtoh_vec(ull, 2).unwrap();
        assert_eq!(ullv, vec![(total as u64) << 33, total as u64 - 1]);
        assert_eq!(d.dtoh_vec::<f32>(f, 1).unwrap()[0], total as f32 * 0.5);
        assert_eq!(d.dtoh_vec::<f64>(dd, 1).unwrap()[0], total as f64 * 0.25);
    }
}

#[test]
fn threads_that_exit_early_do_not_block_syncthreads() {
    let d = EmuDevice::new();
    let out = d.alloc(64 * 4).unwrap();
    for order in [ThreadOrder::Forward, ThreadOrder::Reverse] {
        d.set_thread_order(order);
        run(
            &d,
            "emu_early_exit",
            LaunchConfig::linear(1, 64),
            &[out.into()],
        );
        let o: Vec<f32> = d.dtoh_vec(out, 48).unwrap();
        assert_eq!(o, (0..48).map(|t| (47 - t) as f32).collect::<Vec<_>>());
    }
}

#[test]
fn launches_are_counted_and_kernels_listed() {
    let d = EmuDevice::new();
    assert!(d.kernel_names().contains(&"emu_builtins"));
    let info = d.kernel_info("emu_signature").unwrap();
    assert_eq!(info.file, "emu_errors.cu");
    let sizes: Vec<usize> = info.params.iter().map(|p| p.size).collect();
    assert_eq!(sizes, vec![8, 8, 8, 4, 8]);
    assert_eq!(info.params[0].ty, "float const*");
    let out = d.alloc(12 * 4).unwrap();
    let before = d.launch_count();
    run(
        &d,
        "emu_builtins",
        LaunchConfig::linear(1, 1),
        &[out.into()],
    );
    run(
        &d,
        "emu_builtins",
        LaunchConfig::linear(1, 1),
        &[out.into()],
    );
    assert_eq!(d.launch_count(), before + 2);
    assert!(matches!(
        d.function("no_such_kernel"),
        Err(lmi_cuda::CudaError::UnknownKernel(_))
    ));
}

/// Not a timing assertion: prints what a 1024-thread block doing 32 __syncthreads costs.
#[test]
fn barrier_cost_of_a_1024_thread_block() {
    let d = EmuDevice::new();
    let out = d.alloc(1024 * 4).unwrap();
    let f = d.function("emu_many_syncs").unwrap();
    let args = [out.into(), Arg::U32(16)]; // 16 rounds of 2 barriers
    d.launch(f, &LaunchConfig::linear(1, 1024), &args).unwrap(); // warms the fiber stacks
    let runs = 20;
    let t = std::time::Instant::now();
    for _ in 0..runs {
        d.launch(f, &LaunchConfig::linear(1, 1024), &args).unwrap();
    }
    let per = t.elapsed() / runs;
    println!("one 1024-thread block with 32 __syncthreads: {per:?} per launch");
    let o: Vec<f32> = d.dtoh_vec(out, 1024).unwrap();
    let want: f32 = (0..16).map(|r| (1 + r) as f32).sum(); // thread 0 reads s[1] = 1 + r
    assert_eq!(o[0], want);
}
