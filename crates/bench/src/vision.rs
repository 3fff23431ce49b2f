//! `lmi bench vision`: what images cost a vision-language model on this machine.
//! - Preprocessing (PNG and JPEG decode, smart resize, bicubic, normalization, patches) in ms
//!   per megapixel on one thread, with transformers' default Qwen2.5-VL processor; the peer
//!   (Pillow and transformers' processor on the same files) is `tests/peers/vision_preprocess_bench.py`.
//! - The vision encoder's ms per image at 448² and 1024², for the served model's tower and a
//!   full-size Qwen2.5-VL tower (random weights, 32 blocks of 1280), beside the time the same
//!   multiply-adds take through our f32 matrix product at its measured rate here.
//! - Through the scheduler with the served model: time to first token with one image against
//!   the same prompt without it, the same image again (encoder cache) and again with the same
//!   prompt (prefix cache), and requests per second with 16 clients each sending its own image.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use lmi_engine::engine::EngineOptions;
use lmi_engine::vision::{MediaKind, VisionConfig, VisionInput, VisionTower, VisionVariant};
use lmi_engine::{DType, Device};
use lmi_media::ProcessorConfig;
use lmi_scheduler::{Event, GenerateRequest, Handle, MediaSpan, Prompt, SchedulerConfig, Span};

#[derive(clap::Args)]
pub struct VisionArgs {
    /// A Qwen2-VL or Qwen2.5-VL model directory (default: the tiny test model).
    #[arg(long, default_value = "tests/fixtures/qwen_vl/qwen2_5_vl")]
    model: std::path::PathBuf,
    /// Blocks of the full-size tower to run (32 in Qwen2.5-VL; fewer for a quick look, the
    /// ratio to the matrix product's rate stays meaningful).
    #[arg(long, default_value_t = 32)]
    full_depth: usize,
    /// Skip the full-size tower (minutes on a small machine).
    #[arg(long)]
    no_full_tower: bool,
    /// Concurrent clients of the throughput case.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Tokens generated per request in the scheduler cases.
    #[arg(long, default_value_t = 16)]
    max_new_tokens: usize,
    /// Also write the preprocessing cases' images here (`WxH.png`, `WxH.jpg`), for the peer
    /// measurement `tests/peers/vision_preprocess_bench.py`.
    #[arg(long)]
    images_dir: Option<std::path::PathBuf>,
}

pub fn run(a: VisionArgs) -> anyhow::Result<()> {
    println!(
        "lmi bench vision: model {}, {} threads\n",
        a.model.display(),
        rayon::current_num_threads()
    );
    preprocessing(a.images_dir.as_deref())?;
    encoders(&a)?;
    scheduler(&a)
}

/// A synthetic photo-like RGB image: smooth gradients with a little deterministic noise
/// (PNG compresses it as it would a photo, not a flat fill).
fn synthetic(w: u32, h: u32, seed: u32) -> image::RgbImage {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    image::RgbImage::from_fn(w, h, |i, j| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let n = x & 15;
        let base = |a: u32, b: u32| ((a * 255 / w.max(1) + b * 255 / h.max(1)) / 2 + n) as u8;
        image::Rgb([base(i, j), base(w - i, j), base(i, h - j)])
    })
}

/// The same pixels as preprocessing takes them.
fn rgb(img: &image::RgbImage) -> lmi_media::RgbImage {
    lmi_media::RgbImage {
        width: img.width(),
        height: img.height(),
        data: img.as_raw().clone(),
    }
}

/// The image encoded as PNG, or as JPEG at quality 90 (what a phone or a browser sends).
fn encode(img: &image::RgbImage, format: image::ImageFormat) -> anyhow::Result<Vec<u8>> {
    let mut out = std::io::Cursor::new(Vec::new());
    if format == image::ImageFormat::Jpeg {
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
            .encode_image(img)
            .context("encoding a JPEG")?;
    } else {
        img.write_to(&mut out, format)
            .with_context(|| format!("encoding a {format:?}"))?;
    }
    Ok(out.into_inner())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Decode and preprocess on one thread, as a request's own work.
fn preprocessing(images_dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let cfg = ProcessorConfig::default();
    // Noise-laden synthetic photos compress worse than real ones: room for the 12 MP PNG.
    let limits = lmi_media::ImageLimits {
        max_bytes: 64 << 20,
        ..Default::default()
    };
    println!("## Preprocessing (one thread, transformers' default Qwen2.5-VL processor)\n");
    println!(
        "| image | format | MP | bytes | decode ms | resize ms | normalize + patches ms | total ms | ms per MP | without decode | patches |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let sizes = [(640, 480), (1280, 800), (1920, 1080), (4032, 3024)];
    let formats = [image::ImageFormat::Png, image::ImageFormat::Jpeg];
    for (format, (w, h)) in formats.into_iter().flat_map(|f| sizes.map(|s| (f, s))) {
        let bytes = encode(&synthetic(w, h, 7), format)?;
        if let Some(dir) = images_dir {
            let path = dir.join(format!("{w}x{h}.{}", format.extensions_str()[0]));
            std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(&path, &bytes))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let (mut dec, mut res, mut all, mut patches) = (Vec::new(), Vec::new(), Vec::new(), 0);
        for _ in 0..9 {
            pool.install(|| -> anyhow::Result<()> {
                let t = Instant::now();
                let img = lmi_media::decode_image(&bytes, &limits)?;
                let t1 = Instant::now();
                let p = lmi_media::preprocess_image(&img, &cfg)?;
                let t2 = Instant::now();
                // The resize alone, to the size preprocessing chose.
                let (rh, rw) = lmi_media::smart_resize(
                    img.height,
                    img.width,
                    cfg.factor(),
                    cfg.min_pixels,
                    cfg.max_pixels,
                )?;
                let t3 = Instant::now();
                std::hint::black_box(lmi_media::resize_bicubic(&img, rw, rh));
                res.push(t3.elapsed());
                dec.push(t1 - t);
                all.push(t2 - t1);
                patches = p.grid_thw.iter().product::<usize>();
                Ok(())
            })?;
        }
        let (d, r, p) = (median(dec), median(res), median(all));
        let mp = (w * h) as f64 / 1e6;
        println!(
            "| {w}x{h} | {} | {mp:.2} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {patches} |",
            format.extensions_str()[0],
            bytes.len(),
            ms(d),
            ms(r),
            ms(p.saturating_sub(r)),
            ms(d + p),
            ms(d + p) / mp,
            ms(p) / mp
        );
    }
    println!();
    Ok(())
}

/// Qwen2.5-VL's vision tower at full size (the 3B and 7B checkpoints' `vision_config`),
/// merging into a 1536-wide language model (a 2B-sized one).
fn full_size(depth: usize) -> VisionConfig {
    VisionConfig {
        variant: VisionVariant::Qwen25Vl,
        depth,
        hidden_size: 1280,
        num_heads: 16,
        intermediate_size: 3420,
        out_hidden_size: 1536,
        in_chans: 3,
        patch_size: 14,
        temporal_patch_size: 2,
        spatial_merge_size: 2,
        window_size: 112,
        fullatt_block_indexes: [7, 15, 23, 31].into_iter().filter(|&i| i < depth).collect(),
        tokens_per_second: 2.0,
        num_position_embeddings: 0,
        deepstack_visual_indexes: Vec::new(),
        act: lmi_engine::vision::VisionAct::GeluTanh,
        rope_theta: 10_000.0,
        image_token_id: 0,
        video_token_id: 1,
        vision_start_token_id: None,
        vision_end_token_id: None,
        gemma4: None,
    }
}

/// An image's patches for a tower: `side`² pixels after the processor's resize.
fn patches_for(side: u32, merge: usize) -> anyhow::Result<VisionInput> {
    let cfg = ProcessorConfig {
        min_pixels: 0,
        max_pixels: u64::MAX,
        ..Default::default()
    };
    let p = lmi_media::preprocess_image(&rgb(&synthetic(side, side, side)), &cfg)?;
    Ok(VisionInput {
        kind: MediaKind::Image,
        grid_thw: p.grid_thw,
        pixels: p.pixels,
        merge_size: merge,
        t_scale: 1.0,
    })
}

/// Multiply-adds per second of our f32 matrix product at a tower's MLP shape.
fn matmul_rate(rows: usize, k: usize, n: usize) -> f64 {
    let x = vec![0.01f32; rows * k];
    let w = vec![0.02f32; n * k];
    let mut out = vec![0f32; rows * n];
    lmi_engine::cpu::linear(&x, rows, k, &w, n, None, &mut out);
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        lmi_engine::cpu::linear(&x, rows, k, &w, n, None, &mut out);
        times.push(t.elapsed());
    }
    (rows * k * n) as f64 / median(times).as_secs_f64()
}

fn encoders(a: &VisionArgs) -> anyhow::Result<()> {
    let dir = &a.model;
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(16),
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(dir, &opts)?;
    let served = engine
        .model()
        .vision
        .as_ref()
        .with_context(|| format!("{} is not a vision-language model", dir.display()))?;
    let full = (!a.no_full_tower).then(|| VisionTower::random(&full_size(a.full_depth), 1));
    let mut towers = vec![(format!("{} (served)", dir.display()), served)];
    if let Some(t) = &full {
        towers.push((
            format!("Qwen2.5-VL full size, {} of 32 blocks", t.config().depth),
            t,
        ));
    }
    println!("## Vision encoder (f32, all threads)\n");
    println!(
        "| tower | image | patches | GMAC | ms | GMAC/s | matmul GMAC/s here | ratio (time / at matmul rate) |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    for (name, tower) in &towers {
        let c = tower.config();
        for side in [448u32, 1024] {
            let input = patches_for(side, c.spatial_merge_size)?;
            let n: usize = input.grid_thw.iter().product();
            let rate = matmul_rate(n.min(1024), c.hidden_size, c.intermediate_size);
            let macs = tower.macs(&input) as f64;
            let runs = if macs > 1e11 { 1 } else { 3 };
            lmi_engine::cpu::vision::forward(tower, &input)?; // warm: page in the weights
            let mut times = Vec::new();
            for _ in 0..runs {
                let t = Instant::now();
                lmi_engine::cpu::vision::forward(tower, &input)?;
                times.push(t.elapsed());
            }
            let t = median(times);
            let ideal = macs / rate;
            println!(
                "| {name} | {side}² | {n} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} |",
                macs / 1e9,
                ms(t),
                macs / t.as_secs_f64() / 1e9,
                rate / 1e9,
                t.as_secs_f64() / ideal
            );
        }
    }
    println!();
    Ok(())
}

/// One request's prompt: text tokens, then (optionally) an image, then a question.
fn prompt(
    tok: &lmi_text::Tokenizer,
    image: Option<(&VisionInput, u32, u128)>,
    variant: usize,
) -> anyhow::Result<Prompt> {
    let before = tok.encode(
        &format!("Request {variant}. You are a careful assistant who describes pictures."),
        false,
    )?;
    let after = tok.encode("What is in this picture? Answer in one sentence.", false)?;
    let mut spans = vec![Span::Text(before)];
    if let Some((input, placeholder, hash)) = image {
        spans.push(Span::Media(MediaSpan {
            placeholder,
            len: input.tokens(),
            hash,
            input: Some(Arc::new(input.clone())),
        }));
    }
    spans.push(Span::Text(after));
    Ok(Prompt::from_spans(spans))
}

fn hash_of(input: &VisionInput) -> u128 {
    let bytes: Vec<u8> = input.pixels.iter().flat_map(|v| v.to_le_bytes()).collect();
    lmi_media::content_hash(&bytes)
}

/// Runs one request to the end; returns its time to first token and its whole time.
fn run_one(handle: &Handle, p: Prompt, max_new: usize) -> anyhow::Result<(Duration, Duration)> {
    let mut r = GenerateRequest::with_prompt(p);
    r.stopping.max_new_tokens = max_new;
    r.stopping.ignore_eos = true;
    let t = Instant::now();
    let mut s = handle.submit(r)?;
    let mut first = None;
    while let Some(e) = s.blocking_recv() {
        match e {
            Event::Token(_) if first.is_none() => first = Some(t.elapsed()),
            Event::Error(e) => anyhow::bail!("a request failed: {e}"),
            _ => {}
        }
    }
    Ok((first.unwrap_or_default(), t.elapsed()))
}

fn scheduler(a: &VisionArgs) -> anyhow::Result<()> {
    let dir = &a.model;
    let tok = lmi_text::Tokenizer::from_dir(dir)?;
    let config = lmi_engine::ModelConfig::from_file(&dir.join("config.json"))?;
    let v = config
        .vision
        .clone()
        .context("not a vision-language model")?;
    let processor = ProcessorConfig::from_dir(dir)?;
    let image = |seed: u32| -> anyhow::Result<VisionInput> {
        let img = synthetic(448, 448, seed);
        let p = lmi_media::preprocess_image(&rgb(&img), &processor)?;
        Ok(VisionInput {
            kind: MediaKind::Image,
            grid_thw: p.grid_thw,
            pixels: p.pixels,
            merge_size: v.spatial_merge_size,
            t_scale: 1.0,
        })
    };
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(64 * a.concurrency.max(4)),
        ..Default::default()
    };
    let engine = lmi_engine::open(Device::Cpu, dir, &opts)?;
    let cfg = SchedulerConfig {
        max_batch_size: a.concurrency.max(1),
        max_batch_tokens: 2048,
        max_model_len: 2048,
        max_waiting: 4 * a.concurrency.max(1),
        ..Default::default()
    };
    let handle = Handle::spawn(engine, tok.clone(), cfg);
    let img = image(1)?;
    let item = (&img, v.image_token_id, hash_of(&img));
    println!(
        "## Through the scheduler ({}, f32, {} new tokens, a 448x448 image = {} tokens)\n",
        dir.display(),
        a.max_new_tokens,
        img.tokens()
    );
    println!("| case | TTFT ms (median of 5) | encoder items | encoder ms |\n|---|---:|---:|---:|");
    let snapshot = || handle.metrics().snapshot();
    let case = |name: &str, make: &dyn Fn(usize) -> anyhow::Result<Prompt>| -> anyhow::Result<()> {
        let before = snapshot();
        let mut ttft = Vec::new();
        for i in 0..5 {
            ttft.push(run_one(&handle, make(i)?, a.max_new_tokens)?.0);
        }
        let after = snapshot();
        println!(
            "| {name} | {:.1} | {} | {:.1} |",
            ms(median(ttft)),
            after.encoder_items - before.encoder_items,
            (after.encoder_nanos - before.encoder_nanos) as f64 / 1e6
        );
        Ok(())
    };
    case("text only (no image)", &|i| prompt(&tok, None, 1000 + i))?;
    case("a new image each time", &|i| {
        let im = image(100 + i as u32)?;
        let h = hash_of(&im);
        prompt(&tok, Some((&im, v.image_token_id, h)), 2000 + i)
    })?;
    case("the same image, a new prompt (encoder cache)", &|i| {
        prompt(&tok, Some(item), 3000 + i)
    })?;
    case("the same image and prompt (prefix cache)", &|_| {
        prompt(&tok, Some(item), 3000)
    })?;
    println!();

    // Throughput: every client sends its own image, back to back.
    let rounds = 2;
    let prompts: Vec<Vec<Prompt>> = (0..a.concurrency)
        .map(|c| {
            (0..rounds)
                .map(|r| {
                    let im = image(10_000 + (c * rounds + r) as u32)?;
                    let h = hash_of(&im);
                    prompt(
                        &tok,
                        Some((&im, v.image_token_id, h)),
                        5000 + c * rounds + r,
                    )
                })
                .collect()
        })
        .collect::<anyhow::Result<_>>()?;
    let handle = Arc::new(handle);
    let t = Instant::now();
    let threads: Vec<_> = prompts
        .into_iter()
        .map(|ps| {
            let h = handle.clone();
            let max_new = a.max_new_tokens;
            std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
                ps.into_iter()
                    .map(|p| run_one(&h, p, max_new).map(|(f, _)| f))
                    .collect()
            })
        })
        .collect();
    let mut ttft = Vec::new();
    for r in crate::join_clients(threads)? {
        ttft.extend(r?);
    }
    let wall = t.elapsed();
    let n = ttft.len();
    println!(
        "| clients | requests | each a different image | requests/s | TTFT p50 ms |\n|---:|---:|---|---:|---:|\n| {} | {n} | yes | {:.2} | {:.1} |\n",
        a.concurrency,
        n as f64 / wall.as_secs_f64(),
        ms(median(ttft))
    );
    Ok(())
}
