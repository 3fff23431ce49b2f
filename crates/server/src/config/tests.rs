use super::*;
use lmi_engine::Device;

fn env(pairs: &[(&str, &str)]) -> EnvVars {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn defaults_without_any_input() {
    let c = ServingConfig::load(&ServeArgs::default(), &env(&[]), None).unwrap();
    assert_eq!(c.model_id, None);
    assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 8080));
    assert_eq!(c.max_rolling_batch_size, 32);
    assert_eq!(c.max_rolling_batch_prefill_tokens, 256);
    assert_eq!(c.job_queue_size, 1000);
    assert_eq!(c.max_concurrent_requests, 1032);
    assert_eq!(c.max_request_size, 2_000_000);
    assert_eq!((c.batch_size, c.max_batch_delay_ms), (1, 100));
    assert_eq!((c.max_loras, c.max_cpu_loras), (4, 4));
    assert_eq!(c.engine_dtype(), DType::BF16);
    assert_eq!(c.engine_mode, EngineMode::Model);
    assert_eq!(c.kv_cache_bytes, 1 << 30);
    assert!(c.properties_file.is_none() && c.raw.is_empty());
}

#[test]
fn precedence_cli_then_properties_then_env_then_alias() {
    let tmp = tempfile::tempdir().unwrap();
    let props = write(
        tmp.path(),
        "serving.properties",
        "option.max_rolling_batch_size=16\noption.max_rolling_batch_prefill_tokens=2048\n",
    );
    let e = env(&[
        ("MAX_BATCH_SIZE", "4"),
        ("OPTION_MAX_ROLLING_BATCH_SIZE", "8"),
        ("OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS", "1024"),
        ("OPTION_MAX_MODEL_LEN", "300"),
        ("MAX_BATCH_PREFILL_TOKENS", "999"),
        ("MAX_CONCURRENT_REQUESTS", "77"),
    ]);
    let cli = ServeArgs {
        properties: Some(props.clone()),
        max_batch_size: Some(3),
        ..Default::default()
    };
    let c = ServingConfig::load(&cli, &e, None).unwrap();
    // CLI beats the file, which beats OPTION_*, which beats the alias.
    assert_eq!(c.max_rolling_batch_size, 3);
    assert_eq!(c.raw["option.max_rolling_batch_size"].source, Source::Cli);
    // serving.properties beats OPTION_* (LMI rule).
    assert_eq!(c.max_rolling_batch_prefill_tokens, 2048);
    assert_eq!(
        c.raw["option.max_rolling_batch_prefill_tokens"].source,
        Source::Properties(props.clone())
    );
    // OPTION_* alone.
    assert_eq!(c.max_model_len, Some(300));
    // The alias fills job_queue_size when SERVING_JOB_QUEUE_SIZE is unset.
    assert_eq!(c.job_queue_size, 77);
    assert!(
        matches!(&c.raw["job_queue_size"].source, Source::Env(v) if v.starts_with("MAX_CONCURRENT_REQUESTS"))
    );

    // Without the file and the flag, OPTION_* beats the alias.
    let c = ServingConfig::load(&ServeArgs::default(), &e, None).unwrap();
    assert_eq!(c.max_rolling_batch_size, 8);
    assert_eq!(c.max_rolling_batch_prefill_tokens, 1024);
    // And the alias alone counts.
    let c = ServingConfig::load(
        &ServeArgs::default(),
        &env(&[("MAX_BATCH_SIZE", "4")]),
        None,
    )
    .unwrap();
    assert_eq!(c.max_rolling_batch_size, 4);
}

#[test]
fn properties_found_in_model_dir_then_sagemaker_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    write(&model, "config.json", "{}");
    write(&model, "serving.properties", "option.tgi_compat=true\n");
    let sm = tmp.path().join("sm");
    write(&sm, "config.json", "{}");
    write(
        &sm,
        "serving.properties",
        "option.dtype=fp32\nbatch_size=4\n",
    );

    let cli = ServeArgs {
        model: Some(model.to_string_lossy().into()),
        ..Default::default()
    };
    let c = ServingConfig::load(&cli, &env(&[]), Some(&sm)).unwrap();
    assert_eq!(
        c.properties_file.as_deref(),
        Some(model.join("serving.properties").as_path())
    );
    assert!(c.tgi_compat);
    assert_eq!(c.engine_dtype(), DType::BF16);

    // The model named by HF_MODEL_ID is looked in as well.
    let e = env(&[("HF_MODEL_ID", model.to_str().unwrap())]);
    let c = ServingConfig::load(&ServeArgs::default(), &e, Some(&sm)).unwrap();
    assert!(c.tgi_compat);
    assert_eq!(c.model_id.as_deref(), model.to_str());

    // No model given: the SageMaker directory's file, and its model.
    let c = ServingConfig::load(&ServeArgs::default(), &env(&[]), Some(&sm)).unwrap();
    assert_eq!(
        c.properties_file.as_deref(),
        Some(sm.join("serving.properties").as_path())
    );
    assert_eq!(c.engine_dtype(), DType::F32);
    assert_eq!(c.batch_size, 4);
    assert_eq!(c.model_id.as_deref(), sm.to_str());

    // A missing --properties file is an error.
    let cli = ServeArgs {
        properties: Some(tmp.path().join("nope.properties")),
        ..Default::default()
    };
    let err = ServingConfig::load(&cli, &env(&[]), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no such file"), "{err}");
}

#[test]
fn devices_parse_and_cuda_refuses_fp32_weights() {
    let with = |device: &str, dtype: Option<&str>| {
        let cli = ServeArgs {
            device: Some(device.into()),
            dtype: dtype.map(str::to_string),
            ..Default::default()
        };
        ServingConfig::load(&cli, &env(&[]), None)
    };
    assert_eq!(with("cuda", None).unwrap().device, Device::Cuda(0));
    assert_eq!(
        with("cuda:1", Some("bf16")).unwrap().device,
        Device::Cuda(1)
    );
    let err = with("cuda", Some("fp32")).unwrap_err().to_string();
    assert!(err.contains("keeps weights in bf16"), "{err}");
    // A GPU's KV cache takes a share of its memory, unless a size is given.
    assert_eq!(
        with("cuda", None).unwrap().gpu_memory_utilization,
        Some(0.9)
    );
    assert_eq!(with("cpu", None).unwrap().gpu_memory_utilization, None);
    let sized = ServeArgs {
        device: Some("cuda".into()),
        kv_cache_bytes: Some("2G".into()),
        ..Default::default()
    };
    let c = ServingConfig::load(&sized, &env(&[]), None).unwrap();
    assert_eq!(
        (c.gpu_memory_utilization, c.kv_cache_bytes),
        (None, 2 << 30)
    );
    let e = env(&[("OPTION_GPU_MEMORY_UTILIZATION", "0.5")]);
    let cli = ServeArgs {
        device: Some("cuda".into()),
        ..Default::default()
    };
    assert_eq!(
        ServingConfig::load(&cli, &e, None)
            .unwrap()
            .gpu_memory_utilization,
        Some(0.5)
    );
    let e = env(&[("OPTION_GPU_MEMORY_UTILIZATION", "1.5")]);
    let err = ServingConfig::load(&cli, &e, None).unwrap_err().to_string();
    assert!(err.contains("OPTION_GPU_MEMORY_UTILIZATION"), "{err}");
    let e = env(&[("OPTION_DEVICE", "cpu")]);
    assert_eq!(
        ServingConfig::load(&ServeArgs::default(), &e, None)
            .unwrap()
            .device,
        Device::Cpu
    );
    let e = env(&[("OPTION_DEVICE", "tpu")]);
    let err = ServingConfig::load(&ServeArgs::default(), &e, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("OPTION_DEVICE") && err.contains("cpu, cuda"),
        "{err}"
    );
}

#[test]
fn bad_values_name_the_key_and_source() {
    let e = env(&[("OPTION_MAX_ROLLING_BATCH_SIZE", "lots")]);
    let err = ServingConfig::load(&ServeArgs::default(), &e, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("option.max_rolling_batch_size"), "{err}");
    assert!(err.contains("OPTION_MAX_ROLLING_BATCH_SIZE"), "{err}");
    let e = env(&[("OPTION_TGI_COMPAT", "maybe")]);
    assert!(ServingConfig::load(&ServeArgs::default(), &e, None).is_err());
    let e = env(&[("OPTION_DTYPE", "int3")]);
    assert!(ServingConfig::load(&ServeArgs::default(), &e, None).is_err());
}

#[test]
fn payload_limit_kv_bytes_engine_mode_and_generic_options() {
    let e = env(&[
        ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "6"),
        ("SAGEMAKER_BIND_TO_PORT", "9090"),
    ]);
    let c = ServingConfig::load(&ServeArgs::default(), &e, None).unwrap();
    assert_eq!(c.max_request_size, 6 * 1024 * 1024);
    assert_eq!(c.port, 9090);
    let cli = ServeArgs {
        payload_limit: Some(1000),
        port: Some(1234),
        kv_cache_bytes: Some("256M".into()),
        engine: Some("null".into()),
        options: vec![
            "max_loras=8".into(),
            "batch_size=2".into(),
            "option.foo=bar".into(),
        ],
        adapters: Some("a=/x/a,/y/b".into()),
        ..Default::default()
    };
    let c = ServingConfig::load(&cli, &e, None).unwrap();
    assert_eq!((c.max_request_size, c.port), (1000, 1234));
    assert_eq!(c.kv_cache_bytes, 256 << 20);
    assert_eq!(c.engine_mode, EngineMode::Null);
    assert_eq!((c.max_loras, c.max_cpu_loras, c.batch_size), (8, 8, 2));
    assert_eq!(c.option("option.foo"), Some("bar"));
    assert!(c.enable_lora);
    assert_eq!(
        c.adapters,
        vec![
            ("a".into(), PathBuf::from("/x/a")),
            ("b".into(), PathBuf::from("/y/b"))
        ]
    );
    let summary = c.summary();
    assert!(
        summary.contains("option.foo = bar <- command line"),
        "{summary}"
    );
}

#[test]
fn byte_sizes() {
    assert_eq!(parse_bytes("1073741824").unwrap(), 1 << 30);
    assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_bytes("64k").unwrap(), 64 << 10);
    assert!(parse_bytes("0").is_err());
    assert!(parse_bytes("12T").is_err());
    assert!(parse_bytes("lots").is_err());
}

#[test]
fn vllm_names_count_when_lmi_names_are_unset() {
    let e = env(&[
        ("OPTION_MAX_NUM_SEQS", "12"),
        ("OPTION_MAX_NUM_BATCHED_TOKENS", "512"),
    ]);
    let c = ServingConfig::load(&ServeArgs::default(), &e, None).unwrap();
    assert_eq!(
        (c.max_rolling_batch_size, c.max_rolling_batch_prefill_tokens),
        (12, 512)
    );
    let e = env(&[
        ("OPTION_MAX_NUM_SEQS", "12"),
        ("OPTION_MAX_ROLLING_BATCH_SIZE", "6"),
    ]);
    let c = ServingConfig::load(&ServeArgs::default(), &e, None).unwrap();
    assert_eq!(c.max_rolling_batch_size, 6);
}

#[test]
fn sm_num_gpus_picks_the_gpu_unless_option_device_says_otherwise() {
    let load =
        |pairs: &[(&str, &str)]| ServingConfig::load(&ServeArgs::default(), &env(pairs), None);
    let c = load(&[("SM_NUM_GPUS", "4")]).unwrap();
    assert_eq!(
        (c.device, c.tensor_parallel_degree),
        (Device::Cuda(0), Some(4))
    );
    assert_eq!(
        c.raw["option.tensor_parallel_degree"].source,
        Source::Env("SM_NUM_GPUS (alias of TENSOR_PARALLEL_DEGREE)".into())
    );
    let c = load(&[("SM_NUM_GPUS", "0")]).unwrap();
    assert_eq!((c.device, c.tensor_parallel_degree), (Device::Cpu, Some(0)));
    // The CPU image sets OPTION_DEVICE=cpu: a platform-set SM_NUM_GPUS does not override it.
    let c = load(&[("SM_NUM_GPUS", "1"), ("OPTION_DEVICE", "cpu")]).unwrap();
    assert_eq!(c.device, Device::Cpu);
    let c = load(&[("OPTION_TENSOR_PARALLEL_DEGREE", "max")]).unwrap();
    assert_eq!(
        (c.device, c.tensor_parallel_degree),
        (Device::Cuda(0), Some(1))
    );
    let e = load(&[("SM_NUM_GPUS", "two")]).unwrap_err().to_string();
    assert!(
        e.contains("tensor_parallel_degree") && e.contains("SM_NUM_GPUS"),
        "{e}"
    );
}

#[test]
fn sagemaker_port_and_drain_timeout() {
    let c = ServingConfig::load(
        &ServeArgs::default(),
        &env(&[
            ("SAGEMAKER_BIND_TO_PORT", "9123"),
            ("OPTION_DRAIN_TIMEOUT", "5"),
        ]),
        None,
    )
    .unwrap();
    assert_eq!((c.port, c.drain_timeout_secs), (9123, 5));
    let c = ServingConfig::load(&ServeArgs::default(), &env(&[]), None).unwrap();
    assert_eq!((c.port, c.drain_timeout_secs), (8080, 60));
}

/// Every example in config/, loaded the way `lmi serve --properties FILE` loads it.
#[test]
fn example_serving_properties_load_through_the_real_path() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config");
    let load = |name: &str| {
        let cli = ServeArgs {
            properties: Some(dir.join(name)),
            ..Default::default()
        };
        ServingConfig::load(&cli, &env(&[]), None)
            .unwrap_or_else(|e| panic!("config/{name}: {e:#}"))
    };
    let mut examples: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".serving.properties"))
        .collect();
    examples.sort();
    assert_eq!(
        examples,
        [
            "cpu-default.serving.properties",
            "embedding.serving.properties",
            "gpu-llama3-8b.serving.properties",
            "lora.serving.properties",
            "tgi-compat.serving.properties",
        ],
        "a new example needs its assertions here"
    );

    let c = load("cpu-default.serving.properties");
    assert_eq!((c.device, c.model_id.as_deref()), (Device::Cpu, None));
    assert_eq!((c.engine_dtype(), c.kv_cache_bytes), (DType::BF16, 1 << 30));
    assert_eq!(c.output_formatter.as_deref(), Some("json"));

    let c = load("embedding.serving.properties");
    assert_eq!(c.pooling.task, Some(lmi_checkpoint::pooling::Task::Embed));
    assert_eq!(c.pooling.max_inputs, 256);
    assert_eq!(c.max_rolling_batch_prefill_tokens, 2048);

    let c = load("gpu-llama3-8b.serving.properties");
    assert_eq!(c.device, Device::Cuda(0));
    assert_eq!(c.model_id.as_deref(), Some("/opt/ml/model"));
    assert_eq!(c.tensor_parallel_degree, Some(1));
    assert_eq!(c.gpu_memory_utilization, Some(0.9));
    assert_eq!(
        (c.max_rolling_batch_size, c.max_model_len),
        (128, Some(8192))
    );
    assert_eq!(
        c.served_model_name.as_deref(),
        Some("llama-3.1-8b-instruct")
    );

    let c = load("lora.serving.properties");
    assert!(c.enable_lora);
    let names: Vec<&str> = c.adapters.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["sql", "support", "summarize"]);
    assert_eq!(c.adapters[0].1, PathBuf::from("/opt/ml/adapters/sql"));
    assert_eq!((c.max_loras, c.max_cpu_loras, c.max_lora_rank), (4, 16, 16));
    assert_eq!(c.adapter_dirs, [PathBuf::from("/opt/ml/adapters")]);

    let c = load("tgi-compat.serving.properties");
    assert!(c.tgi_compat);
    assert_eq!(c.max_concurrent_requests, 128);
    assert_eq!(
        c.raw["option.tgi_compat"].source,
        Source::Properties(dir.join("tgi-compat.serving.properties"))
    );
}

#[test]
fn reasoning_options() {
    let load =
        |pairs: &[(&str, &str)]| ServingConfig::load(&ServeArgs::default(), &env(pairs), None);
    let c = load(&[]).unwrap();
    assert_eq!(c.reasoning_parser, None);
    assert_eq!(
        c.reasoning_budget,
        lmi_api::openai::ThinkingBudget::Unlimited
    );
    let c = load(&[
        ("OPTION_REASONING_PARSER", "deepseek_r1"),
        ("OPTION_REASONING_BUDGET", "256"),
    ])
    .unwrap();
    assert_eq!(
        c.reasoning_parser,
        Some(ReasoningParserChoice::Format(
            lmi_text::ReasoningFormat::ThinkTags
        ))
    );
    assert_eq!(
        c.reasoning_budget,
        lmi_api::openai::ThinkingBudget::Tokens(256)
    );
    let c = load(&[("OPTION_REASONING_PARSER", "none")]).unwrap();
    assert_eq!(c.reasoning_parser, Some(ReasoningParserChoice::Off));
    let e = load(&[("OPTION_REASONING_PARSER", "harmonica")]).unwrap_err();
    assert!(e.to_string().contains("option.reasoning_parser"), "{e}");
    let e = load(&[("OPTION_REASONING_BUDGET", "-5")]).unwrap_err();
    assert!(e.to_string().contains("option.reasoning_budget"), "{e}");
}

#[test]
fn window_pools_are_on_unless_the_hybrid_manager_is_disabled() {
    let c = ServingConfig::load(&ServeArgs::default(), &env(&[]), None).unwrap();
    assert!(c.window_pools);
    let e = env(&[("OPTION_DISABLE_HYBRID_KV_CACHE_MANAGER", "true")]);
    assert!(
        !ServingConfig::load(&ServeArgs::default(), &e, None)
            .unwrap()
            .window_pools
    );
    let cli = ServeArgs {
        disable_hybrid_kv_cache_manager: true,
        ..Default::default()
    };
    assert!(
        !ServingConfig::load(&cli, &env(&[]), None)
            .unwrap()
            .window_pools
    );
}

#[test]
fn pooling_options() {
    use lmi_checkpoint::pooling::Task;
    let load =
        |pairs: &[(&str, &str)], cli: ServeArgs| ServingConfig::load(&cli, &env(pairs), None);
    let c = load(&[], ServeArgs::default()).unwrap();
    assert_eq!(c.pooling.task, None);
    // Embedding requests default to 1024 inputs, list prompts of the generation routes to 4.
    assert_eq!((c.pooling.max_inputs, c.max_client_batch_size), (1024, 4));
    let c = load(
        &[("OPTION_TASK", "rerank"), ("MAX_CLIENT_BATCH_SIZE", "64")],
        ServeArgs::default(),
    )
    .unwrap();
    assert_eq!(c.pooling.task, Some(Task::Score));
    assert_eq!((c.pooling.max_inputs, c.max_client_batch_size), (64, 64));
    let c = load(&[("HF_TASK", "feature-extraction")], ServeArgs::default()).unwrap();
    assert_eq!(c.pooling.task, Some(Task::Embed));
    let cli = ServeArgs {
        task: Some("text-embedding".into()),
        max_client_batch_size: Some(32),
        ..Default::default()
    };
    let c = load(&[("OPTION_TASK", "rerank")], cli).unwrap();
    assert_eq!(
        (c.pooling.task, c.pooling.max_inputs),
        (Some(Task::Embed), 32)
    );
    assert!(c.summary().contains("text-embedding"));
    let e = load(&[("OPTION_TASK", "translation")], ServeArgs::default()).unwrap_err();
    assert!(e.to_string().contains("option.task"), "{e}");
    let e = load(
        &[("OPTION_MAX_CLIENT_BATCH_SIZE", "0")],
        ServeArgs::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("option.max_client_batch_size"),
        "{e}"
    );

    // The CPU's default budget (256) grows to hold a 512-token input, up to 8192; a budget
    // that was set stands.
    let c = load(&[], ServeArgs::default()).unwrap();
    assert_eq!(super::pooling::step_tokens(&c, 512), 512);
    assert_eq!(super::pooling::step_tokens(&c, 128), 256);
    assert_eq!(super::pooling::step_tokens(&c, 32768), 8192);
    let c = load(
        &[("OPTION_MAX_NUM_BATCHED_TOKENS", "300")],
        ServeArgs::default(),
    )
    .unwrap();
    assert_eq!(super::pooling::step_tokens(&c, 512), 300);
}
