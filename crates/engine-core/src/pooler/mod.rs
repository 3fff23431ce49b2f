//! What an embedding or scoring model does after its last layer, on the host in f32 (a few
//! vectors per step, small matrices): pooling a sequence's rows ([`pool`]), then the
//! sentence-transformers `Dense` modules, or a scoring head (BERT's pooler and classifier,
//! RoBERTa's classifier, Qwen3-Reranker's yes/no difference). The decoder engine and the
//! encoder engine share it.

use lmi_checkpoint::DType;
use lmi_checkpoint::pooling::{DenseSpec, PoolerInfo, Pooling, ScoreHead};
use lmi_checkpoint::weights::{SafetensorsDir, WeightSource};

use crate::error::{EngineError, Result};

#[cfg(test)]
mod tests;

/// `y = W x + b` on the host (`W` `[out, in]`), each output summed in f64 in index order.
#[derive(Debug, Clone)]
pub struct HostLinear {
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
    pub out: usize,
    pub inp: usize,
}

impl HostLinear {
    /// `{prefix}.weight` `[out, in]` and, when `bias`, `{prefix}.bias`, read in f32.
    pub fn load(
        st: &WeightSource,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<Self> {
        let w = st
            .load(&format!("{prefix}.weight"), &[out, inp], DType::F32)?
            .to_f32_vec();
        let b = match bias {
            true => Some(
                st.load(&format!("{prefix}.bias"), &[out], DType::F32)?
                    .to_f32_vec(),
            ),
            false => None,
        };
        Ok(HostLinear { w, b, out, inp })
    }

    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        (0..self.out)
            .map(|o| {
                let row = &self.w[o * self.inp..(o + 1) * self.inp];
                let dot: f64 = row.iter().zip(x).map(|(&w, &v)| w as f64 * v as f64).sum();
                (dot + self.b.as_ref().map_or(0.0, |b| b[o] as f64)) as f32
            })
            .collect()
    }
}

fn tanh_in_place(v: &mut [f32]) {
    v.iter_mut().for_each(|x| *x = x.tanh());
}

/// A sentence-transformers `Dense` module.
#[derive(Debug, Clone)]
struct Dense {
    linear: HostLinear,
    tanh: bool,
}

/// A scoring head's weights.
#[derive(Debug, Clone)]
enum Score {
    /// `classifier(tanh(pooler.dense(cls)))`.
    Bert {
        pooler: HostLinear,
        classifier: HostLinear,
    },
    /// `out_proj(tanh(dense(cls)))`.
    Roberta {
        dense: HostLinear,
        out_proj: HostLinear,
    },
    /// `h · (W_yes − W_no)`: the LM head's two rows, subtracted in f32 at load.
    YesNo { diff: Vec<f32> },
}

/// The host part of a pooler: what turns a pooled hidden state into the step's output.
#[derive(Debug, Clone)]
pub struct HostHead {
    pooling: Pooling,
    dense: Vec<Dense>,
    score: Option<Score>,
}

/// Where a model's scoring-head weights come from.
pub enum HeadWeights<'a> {
    /// An encoder checkpoint; `prefix` is where its base model's tensors sit (`bert.`,
    /// `roberta.` or nothing), `hidden` its width.
    Encoder {
        st: &'a WeightSource,
        prefix: &'a str,
        hidden: usize,
    },
    /// A causal LM: the two rows of its LM head (`lm_head.weight`, or the tied embedding
    /// `embed`), `[vocab, hidden]`.
    Decoder {
        st: &'a WeightSource,
        head: &'a str,
        vocab: usize,
        hidden: usize,
    },
}

impl HostHead {
    /// The head `info` describes, its weights read from `weights` and its Dense modules'
    /// directories.
    pub fn load(info: &PoolerInfo, weights: HeadWeights<'_>) -> Result<Self> {
        let dense = info
            .dense
            .iter()
            .map(load_dense)
            .collect::<Result<Vec<_>>>()?;
        let score = match (&info.score_head, weights) {
            (None, _) => None,
            (
                Some(ScoreHead::YesNo { yes, no }),
                HeadWeights::Decoder {
                    st,
                    head,
                    vocab,
                    hidden,
                },
            ) => {
                let rows = st.load_rows(head, [vocab, hidden], &[*yes as usize, *no as usize])?;
                let diff = rows[0].iter().zip(&rows[1]).map(|(y, n)| y - n).collect();
                Some(Score::YesNo { diff })
            }
            (Some(ScoreHead::BertClassifier), HeadWeights::Encoder { st, prefix, hidden }) => {
                Some(Score::Bert {
                    pooler: HostLinear::load(
                        st,
                        &format!("{prefix}pooler.dense"),
                        hidden,
                        hidden,
                        true,
                    )?,
                    classifier: HostLinear::load(st, "classifier", info.dimensions, hidden, true)?,
                })
            }
            (Some(ScoreHead::RobertaClassifier), HeadWeights::Encoder { st, hidden, .. }) => {
                Some(Score::Roberta {
                    dense: HostLinear::load(st, "classifier.dense", hidden, hidden, true)?,
                    out_proj: HostLinear::load(
                        st,
                        "classifier.out_proj",
                        info.dimensions,
                        hidden,
                        true,
                    )?,
                })
            }
            (Some(h), _) => {
                return Err(EngineError::Backend(format!(
                    "the scoring head {h:?} does not fit this kind of model"
                )));
            }
        };
        Ok(HostHead {
            pooling: info.pooling,
            dense,
            score,
        })
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The step's output for one sequence from its pooled hidden state: the Dense modules,
    /// or the scoring head.
    pub fn apply(&self, pooled: Vec<f32>) -> Vec<f32> {
        match &self.score {
            Some(Score::Bert { pooler, classifier }) => {
                let mut p = pooler.apply(&pooled);
                tanh_in_place(&mut p);
                classifier.apply(&p)
            }
            Some(Score::Roberta { dense, out_proj }) => {
                let mut p = dense.apply(&pooled);
                tanh_in_place(&mut p);
                out_proj.apply(&p)
            }
            Some(Score::YesNo { diff }) => {
                let s: f64 = diff
                    .iter()
                    .zip(&pooled)
                    .map(|(&d, &h)| d as f64 * h as f64)
                    .sum();
                vec![s as f32]
            }
            None => self.dense.iter().fold(pooled, |x, d| {
                let mut y = d.linear.apply(&x);
                if d.tanh {
                    tanh_in_place(&mut y);
                }
                y
            }),
        }
    }
}

/// A `Dense` module's `linear.weight` / `linear.bias` from its directory.
fn load_dense(spec: &DenseSpec) -> Result<Dense> {
    let st = WeightSource::Safetensors(SafetensorsDir::open(&spec.dir)?);
    let linear = HostLinear::load(
        &st,
        "linear",
        spec.out_features,
        spec.in_features,
        spec.bias,
    )?;
    Ok(Dense {
        linear,
        tanh: spec.tanh,
    })
}

/// One sequence's pooled state from its rows `[len, width]` of final hidden states: the
/// first row, the mean (summed in f64 in row order), or the last row.
pub fn pool(rows: &[f32], width: usize, pooling: Pooling) -> Vec<f32> {
    let len = rows.len() / width.max(1);
    match pooling {
        Pooling::Cls => rows[..width].to_vec(),
        Pooling::Last => rows[(len - 1) * width..len * width].to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0f64; width];
            for r in rows.chunks_exact(width) {
                for (s, &v) in sum.iter_mut().zip(r) {
                    *s += v as f64;
                }
            }
            sum.iter().map(|&s| (s / len as f64) as f32).collect()
        }
    }
}
