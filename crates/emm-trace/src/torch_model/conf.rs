//! The settings of PyTorch's caching allocator, spelled as PyTorch spells them
//! (`PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`, parsed by
//! `CUDAAllocatorConfig::parseArgs` in `c10/cuda/CUDAAllocatorConfig.cpp`).

/// `max_split_size` when unset: no limit (`std::numeric_limits<size_t>::max()`).
pub const NO_MAX_SPLIT: u64 = u64::MAX;

/// One of PyTorch's allocator settings was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PyTorch allocator setting {setting:?} in {conf:?}: {reason}")]
#[non_exhaustive]
pub struct ConfError {
    /// The whole setting string.
    pub conf: String,
    /// The `key:value` pair at fault.
    pub setting: String,
    /// What was wrong, and what PyTorch accepts.
    pub reason: String,
}

/// The settings the model honours; the rest of PyTorch's keys (pinned memory,
/// `release_lock_on_cudamalloc`, …) do not change where blocks go and are
/// accepted and ignored.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchConf {
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
    /// `max_split_size_mb`, in bytes ([`NO_MAX_SPLIT`] when unset).
    pub max_split_size: u64,
    /// `roundup_power2_divisions`: divisions per power-of-two interval from 1 MiB
    /// (`[1MiB, 2MiB)`, `[2MiB, 4MiB)`, … the last one open), 0 for none.
    pub roundup_power2_divisions: Vec<u64>,
    /// `garbage_collection_threshold` (0: off); acts only under a memory fraction.
    pub garbage_collection_threshold: f64,
    /// `max_non_split_rounding_mb`, in bytes: how much larger than an oversize
    /// request a cached oversize block may be and still serve it (20 MiB).
    pub max_non_split_rounding: u64,
    /// `per_process_memory_fraction`: a cap of this share of the device, as
    /// `setMemoryFraction` (`None`: none).
    pub memory_fraction: Option<f64>,
}

impl Default for TorchConf {
    fn default() -> Self {
        TorchConf {
            expandable_segments: false,
            max_split_size: NO_MAX_SPLIT,
            roundup_power2_divisions: vec![0; INTERVALS],
            garbage_collection_threshold: 0.0,
            max_non_split_rounding: 20 << 20,
            memory_fraction: None,
        }
    }
}

/// Intervals of `roundup_power2_divisions`: 1 MiB to 64 GiB in powers of two
/// (`kRoundUpPowerOfTwoIntervals` = 16).
const INTERVALS: usize = 16;

impl TorchConf {
    /// The settings of `PYTORCH_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF`, else
    /// the defaults.
    pub fn from_env() -> Result<TorchConf, ConfError> {
        for var in ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"] {
            if let Some(os) = std::env::var_os(var) {
                // Not UTF-8 is said, not read as unset (the next variable).
                let v = os.into_string().map_err(|os| ConfError {
                    conf: os.to_string_lossy().into_owned(),
                    setting: var.to_owned(),
                    reason: "the variable is not valid UTF-8".to_owned(),
                })?;
                return TorchConf::parse(&v);
            }
        }
        Ok(TorchConf::default())
    }

    /// Parses `key:value` pairs separated by commas, e.g.
    /// `expandable_segments:True,max_split_size_mb:128`.
    pub fn parse(conf: &str) -> Result<TorchConf, ConfError> {
        let mut c = TorchConf::default();
        let err = |setting: &str, reason: String| ConfError {
            conf: conf.to_owned(),
            setting: setting.to_owned(),
            reason,
        };
        // Brackets hold commas of their own (`roundup_power2_divisions:[256:1,>:4]`).
        let mut settings = Vec::new();
        let (mut depth, mut start) = (0usize, 0usize);
        for (i, ch) in conf.char_indices() {
            match ch {
                '[' => depth += 1,
                ']' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    settings.push(&conf[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        settings.push(&conf[start..]);
        let mut seen: Vec<&str> = Vec::new();
        for setting in settings
            .into_iter()
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (key, value) = setting
                .split_once(':')
                .ok_or_else(|| err(setting, "expected key:value".into()))?;
            let (key, value) = (key.trim(), value.trim());
            // PyTorch lets the last of a repeated key win; which one the user
            // meant is not for the model to guess.
            if seen.contains(&key) {
                return Err(err(setting, format!("`{key}` is given more than once")));
            }
            seen.push(key);
            match key {
                "expandable_segments" => {
                    // PyTorch takes `True` and `False` only (as `emm.torch` does).
                    c.expandable_segments = match value {
                        "True" => true,
                        "False" => false,
                        _ => return Err(err(setting, "expected True or False".into())),
                    }
                }
                "max_split_size_mb" => {
                    let mb: u64 = value
                        .parse()
                        .map_err(|_| err(setting, "expected a whole number of MiB".into()))?;
                    // CUDAAllocatorConfig: "max_split_size_mb too small, must be > 20".
                    if mb <= 20 {
                        return Err(err(setting, "PyTorch requires more than 20 (MiB)".into()));
                    }
                    c.max_split_size = mb.saturating_mul(1 << 20);
                }
                "roundup_power2_divisions" => {
                    c.roundup_power2_divisions =
                        parse_divisions(value).map_err(|reason| err(setting, reason))?;
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value
                        .parse()
                        .map_err(|_| err(setting, "expected a number".into()))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(err(setting, "PyTorch requires a value in (0, 1)".into()));
                    }
                    c.garbage_collection_threshold = t;
                }
                "max_non_split_rounding_mb" => {
                    let mb: u64 = value
                        .parse()
                        .map_err(|_| err(setting, "expected a whole number of MiB".into()))?;
                    // "max_non_split_rounding_mb too small, must be >= 20".
                    if mb < 20 {
                        return Err(err(setting, "PyTorch requires at least 20 (MiB)".into()));
                    }
                    c.max_non_split_rounding = mb.saturating_mul(1 << 20);
                }
                "per_process_memory_fraction" => {
                    let f: f64 = value
                        .parse()
                        .map_err(|_| err(setting, "expected a number".into()))?;
                    if !(f > 0.0 && f <= 1.0) {
                        return Err(err(
                            setting,
                            "expected a share of the device in (0, 1]".into(),
                        ));
                    }
                    c.memory_fraction = Some(f);
                }
                "backend" => {
                    if value != "native" {
                        return Err(err(
                            setting,
                            "only the native backend is modelled (cudaMallocAsync is the driver's own pool)".into(),
                        ));
                    }
                }
                "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_num_register_threads"
                | "pinned_use_background_threads"
                | "pinned_reserve_segment_size_mb"
                | "graph_capture_record_stream_reuse" => {}
                _ => return Err(err(setting, format!("unknown key `{key}`"))),
            }
        }
        Ok(c)
    }

    /// The divisions for a request of `size` bytes
    /// (`CUDAAllocatorConfig::roundup_power2_divisions(size)`).
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - u64::from(size.max(1).leading_zeros());
        let start = 20; // log2(1 MiB)
        let i = log.saturating_sub(start).min(INTERVALS as u64 - 1) as usize;
        self.roundup_power2_divisions.get(i).copied().unwrap_or(0)
    }
}

/// `4`, or `[256:1,512:2,>:4]` (keys in MiB, powers of two; `>` for the rest).
fn parse_divisions(value: &str) -> Result<Vec<u64>, String> {
    let check = |d: u64| {
        if d == 0 || d.is_power_of_two() {
            Ok(d)
        } else {
            Err(format!("divisions must be powers of two, found {d}"))
        }
    };
    if let Some(list) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        let mut out = vec![0; INTERVALS];
        let mut last_set = 0usize;
        let mut first = true;
        for pair in list.split(',') {
            let (k, d) = pair
                .split_once(':')
                .ok_or_else(|| format!("expected size:divisions, found {pair:?}"))?;
            let d = check(
                d.trim()
                    .parse()
                    .map_err(|_| format!("bad divisions in {pair:?}"))?,
            )?;
            if k.trim() == ">" {
                for v in out.iter_mut().skip(last_set + 1) {
                    *v = d;
                }
                continue;
            }
            let mb: u64 = k
                .trim()
                .parse()
                .map_err(|_| format!("bad size in {pair:?}"))?;
            if !mb.is_power_of_two() {
                return Err(format!("sizes must be powers of two (MiB), found {mb}"));
            }
            let i = (63 - u64::from(mb.leading_zeros())) as usize;
            let i = i.min(INTERVALS - 1);
            // The first size's divisions also apply below it.
            if first {
                for v in out.iter_mut().take(i) {
                    *v = d;
                }
                first = false;
            }
            out[i] = d;
            last_set = i;
        }
        Ok(out)
    } else {
        let d = check(
            value
                .parse()
                .map_err(|_| "expected a number or a [..] list".to_owned())?,
        )?;
        Ok(vec![d; INTERVALS])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_as_pytorch_spells_them() {
        let c = TorchConf::parse("expandable_segments:True, max_split_size_mb:128").unwrap();
        assert!(c.expandable_segments);
        assert_eq!(c.max_split_size, 128 << 20);
        assert_eq!(TorchConf::parse("").unwrap(), TorchConf::default());
        let d = TorchConf::parse("roundup_power2_divisions:[1:1,2:4,>:8]").unwrap();
        assert_eq!(d.divisions_for(1 << 20), 1);
        assert_eq!(d.divisions_for(3 << 20), 4);
        assert_eq!(d.divisions_for(1 << 30), 8);
        // The first size's divisions also apply below it, as PyTorch fills them.
        let e = TorchConf::parse("roundup_power2_divisions:[256:2,>:4]").unwrap();
        assert_eq!(e.divisions_for(1 << 20), 2);
        assert_eq!(e.divisions_for(300 << 20), 2);
        assert_eq!(e.divisions_for(600 << 20), 4);
        let f = TorchConf::parse("max_non_split_rounding_mb:64,per_process_memory_fraction:0.5")
            .unwrap();
        assert_eq!(
            (f.max_non_split_rounding, f.memory_fraction),
            (64 << 20, Some(0.5))
        );
        assert_eq!(
            TorchConf::parse("roundup_power2_divisions:4")
                .unwrap()
                .divisions_for(5 << 20),
            4
        );
    }

    #[test]
    fn bad_settings_say_what_and_why() {
        for bad in [
            "expandable_segments:yes",
            "max_split_size_mb:10",
            "garbage_collection_threshold:1.5",
            "nonsense:1",
            "backend:cudaMallocAsync",
            "expandable_segments",
            // PyTorch takes True and False only (as emm.torch does).
            "expandable_segments:true",
            "garbage_collection_threshold:1.0",
            // A key given twice: which value was meant is not guessed.
            "max_split_size_mb:128,max_split_size_mb:64",
        ] {
            let e = TorchConf::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains(bad.split(':').next().unwrap()),
                "{e}"
            );
        }
    }
}
