use super::*;

#[test]
fn pooling_picks_or_averages_rows() {
    // Three rows of width 2.
    let rows = [1.0, -2.0, 3.0, 4.0, 5.0, 0.5];
    assert_eq!(pool(&rows, 2, Pooling::Cls), [1.0, -2.0]);
    assert_eq!(pool(&rows, 2, Pooling::Last), [5.0, 0.5]);
    assert_eq!(pool(&rows, 2, Pooling::Mean), [3.0, 2.5 / 3.0]);
}

#[test]
fn heads_compute_what_their_formulas_say() {
    let linear = |w: &[f32], b: &[f32], out, inp| HostLinear {
        w: w.to_vec(),
        b: Some(b.to_vec()),
        out,
        inp,
    };
    let x = vec![0.5f32, -1.0];
    // tanh(P x + p) then C · + c, worked by hand.
    let head = HostHead {
        pooling: Pooling::Cls,
        dense: Vec::new(),
        score: Some(Score::Bert {
            pooler: linear(&[1.0, 2.0, -1.0, 0.0], &[0.25, 0.5], 2, 2),
            classifier: linear(&[2.0, -3.0], &[0.1], 1, 2),
        }),
    };
    let (h0, h1) = ((0.5f64 - 2.0 + 0.25).tanh(), (-0.5f64 + 0.5).tanh());
    let want = 2.0 * h0 - 3.0 * h1 + 0.1;
    let got = head.apply(x.clone());
    assert!((got[0] as f64 - want).abs() < 1e-6, "{got:?} vs {want}");
    let yes_no = HostHead {
        pooling: Pooling::Last,
        dense: Vec::new(),
        score: Some(Score::YesNo {
            diff: vec![3.0, 0.25],
        }),
    };
    assert_eq!(yes_no.apply(x.clone()), [1.25]);
    // Dense modules in turn, the first with tanh.
    let dense = HostHead {
        pooling: Pooling::Mean,
        dense: vec![
            Dense {
                linear: linear(&[1.0, 1.0], &[0.0], 1, 2),
                tanh: true,
            },
            Dense {
                linear: linear(&[2.0, -1.0], &[0.0, 1.0], 2, 1),
                tanh: false,
            },
        ],
        score: None,
    };
    let t = (-0.5f32).tanh();
    assert_eq!(dense.apply(x), [2.0 * t, 1.0 - t]);
}
