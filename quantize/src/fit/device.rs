//! Device profiles: RAM, what the OS keeps, memory and storage bandwidth and
//! decode compute, as data. Built-ins for 8/12/16/24 GB phones
//! (`devices.toml`, next to this file); users write their own in the same
//! TOML, and `memwall plan --measure-host` writes one for the machine it runs on.
//!
//! ```toml
//! [[device]]
//! name = "my-phone"
//! description = "what it is"
//! ram_gb = 16                 # GiB, as sold
//! os_reserve_gb = 4.5         # kept by the OS and other apps
//! ram_bandwidth_gbs = 68.3    # peak, GB/s
//! bandwidth_efficiency = 0.6  # share of the peak a decode loop reaches
//! storage_read_gbs = 4.2      # sequential reads from flash, GB/s
//! threads = 6                 # performance cores to use
//! compute_gweights_s = 16     # decode multiply-adds, billions of weights/s
//! dispatch_us = 10            # fixed cost of one matrix product, µs (optional)
//! overlap_loss = 0            # share of memory/compute time not overlapped (optional)
//! [device.compute]            # optional, per ggml type (overrides the above)
//! Q4_K = 18.0
//! [device.streaming]          # optional, measured: rate per type when weights
//! Q4_K = 6.0                  # stream from RAM (used above cache_mb)
//! ```

use std::path::PathBuf;

use memwall_format::GgmlType;
use memwall_format::suggest::did_you_mean;

use crate::recipe::{RecipeError, parse_type};

const BUILTIN: &str = include_str!("devices.toml");

const GIB: f64 = (1u64 << 30) as f64;

/// Cost of one matrix product besides its arithmetic when a profile does not
/// say (thread wake-up and join on a phone's big cores).
const DEFAULT_DISPATCH: f64 = 10e-6;

/// The keys a profile may have.
const KNOWN: [&str; 15] = [
    "name",
    "description",
    "ram_gb",
    "os_reserve_gb",
    "ram_bandwidth_gbs",
    "bandwidth_efficiency",
    "storage_read_gbs",
    "threads",
    "compute_gweights_s",
    "dispatch_us",
    "overlap_loss",
    "cache_mb",
    "streaming",
    "compute",
    "notes",
];

/// Why [`Device::resolve`] found no profile.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The profile file could not be read.
    #[error("{}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The profile file is not a valid profile.
    #[error("{}: {error}", path.display())]
    Profile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: ProfileError,
    },
    /// The file holds several profiles and none was named.
    #[error(
        "{}: {} device profiles; name one of them: {}",
        path.display(),
        names.len(),
        names.join(", ")
    )]
    Several {
        /// The file.
        path: PathBuf,
        /// Its profiles' names.
        names: Vec<String>,
    },
    /// Neither a built-in profile nor a file.
    #[error(
        "no device profile '{spec}'{}: built-ins are {}, or give a TOML file (see docs/PLAN.md)",
        did_you_mean(spec, builtins.iter().map(String::as_str)),
        builtins.join(", ")
    )]
    Unknown {
        /// What was given.
        spec: String,
        /// The built-in profiles' names.
        builtins: Vec<String>,
    },
}

/// Why a profile file is refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// Not TOML.
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// A `[[device]]` entry that is not a table.
    #[error("device {index}: must be a table")]
    NotATable {
        /// Its position, from 1.
        index: usize,
    },
    /// A `[[device]]` entry with a bad field.
    #[error("device {index}: {error}")]
    Device {
        /// Its position, from 1.
        index: usize,
        /// What is wrong.
        error: FieldError,
    },
    /// `device` is not an array of tables.
    #[error("'device' must be an array of tables ([[device]])")]
    NotAnArray,
    /// A profile at the top level with a bad field.
    #[error(transparent)]
    Field(#[from] FieldError),
}

/// What is wrong with a field of one profile.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum FieldError {
    /// A key profiles do not have.
    #[error("unknown key '{key}' (known: {})", KNOWN.join(", "))]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A number field holding something else.
    #[error("'{key}' must be a number, not {found}")]
    NotANumber {
        /// The key.
        key: &'static str,
        /// The TOML type found.
        found: &'static str,
    },
    /// A required number is absent.
    #[error("needs '{key}'")]
    Missing {
        /// The key.
        key: &'static str,
    },
    /// A number outside its range (or not finite).
    #[error("'{key}' is {value}; expected {lo} to {hi}")]
    OutOfRange {
        /// The key.
        key: &'static str,
        /// Its value.
        value: f64,
        /// The smallest allowed.
        lo: f64,
        /// The largest allowed.
        hi: f64,
    },
    /// No `name`.
    #[error("needs name = \"...\"")]
    NoName,
    /// The OS would keep all the RAM.
    #[error("os_reserve_gb ({reserve}) must be less than ram_gb ({ram})")]
    ReserveTooLarge {
        /// `os_reserve_gb`.
        reserve: f64,
        /// `ram_gb`.
        ram: f64,
    },
    /// A rate table names no ggml type.
    #[error("{key}: {error}")]
    RateType {
        /// The table (`compute`, `streaming`).
        key: &'static str,
        /// Why.
        error: RecipeError,
    },
    /// A rate that is not a positive number.
    #[error("{key}.{ty} must be a positive number")]
    BadRate {
        /// The table.
        key: &'static str,
        /// The type name as written.
        ty: String,
    },
    /// A rate table that is not a table.
    #[error("'{key}' must be a table of type = rate")]
    NotARateTable {
        /// The key.
        key: &'static str,
    },
}

/// A device the model should run on.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    /// Short name.
    pub name: String,
    /// What it is.
    pub description: String,
    /// Installed RAM, bytes.
    pub ram_bytes: u64,
    /// RAM the OS and other apps keep, bytes.
    pub os_reserve_bytes: u64,
    /// Peak memory bandwidth, bytes/s.
    pub ram_bandwidth: f64,
    /// Share of the peak bandwidth a decode loop reaches (0–1].
    pub bandwidth_efficiency: f64,
    /// Sequential read bandwidth of the storage, bytes/s.
    pub storage_read: f64,
    /// Threads to run on.
    pub threads: u32,
    /// Decode multiply-adds per second (weights/s), all threads.
    pub compute: f64,
    /// Per-type decode multiply-adds per second, overriding `compute`.
    pub compute_by_type: Vec<(GgmlType, f64)>,
    /// Fixed cost of one matrix product besides its multiply-adds (waking
    /// the threads, joining them, the small vector work around it), seconds.
    pub dispatch: f64,
    /// How much of the shorter of memory time and compute time is *not*
    /// hidden behind the longer one (0: reads and arithmetic overlap fully, as
    /// llama.cpp's kernels manage on phones; 1: they take turns).
    pub overlap_loss: f64,
    /// Measured decode multiply-adds per second per ggml type when the
    /// weights stream from RAM (larger than the caches): memory and compute
    /// together, as the kernels really combine them. Used instead of the
    /// bandwidth/compute bounds for models larger than `cache_bytes`.
    pub streaming_by_type: Vec<(GgmlType, f64)>,
    /// Weights up to this size count as cache-resident (the compute rates
    /// apply); above it the streaming rates do.
    pub cache_bytes: u64,
}

impl Device {
    /// The built-in profiles.
    pub fn builtins() -> Vec<Device> {
        // The built-in file is part of the source and tested.
        parse_all(BUILTIN).unwrap_or_default()
    }

    /// A built-in profile by name, or the profile(s) in a TOML file (`name`
    /// picks one when the file holds several).
    pub fn resolve(spec: &str) -> Result<Device, DeviceError> {
        if let Some(d) = Device::builtins().into_iter().find(|d| d.name == spec) {
            return Ok(d);
        }
        let path = std::path::Path::new(spec);
        if path.is_file() {
            let text = std::fs::read_to_string(path).map_err(|error| DeviceError::Read {
                path: path.to_owned(),
                error,
            })?;
            let mut all = parse_all(&text).map_err(|error| DeviceError::Profile {
                path: path.to_owned(),
                error,
            })?;
            return match all.len() {
                1 => Ok(all.remove(0)),
                _ => Err(DeviceError::Several {
                    path: path.to_owned(),
                    names: all.into_iter().map(|d| d.name).collect(),
                }),
            };
        }
        Err(DeviceError::Unknown {
            spec: spec.to_owned(),
            builtins: Device::builtins().into_iter().map(|d| d.name).collect(),
        })
    }

    /// RAM one app can use: installed minus the OS reserve.
    pub fn usable_bytes(&self) -> u64 {
        self.ram_bytes.saturating_sub(self.os_reserve_bytes)
    }

    /// Decode multiply-adds per second for weights of type `ty`.
    pub fn compute_for(&self, ty: GgmlType) -> f64 {
        self.compute_by_type
            .iter()
            .find(|(t, _)| *t == ty)
            .map_or(self.compute, |(_, r)| *r)
    }

    /// Measured streaming rate for `ty`, if the profile has one.
    pub fn streaming_for(&self, ty: GgmlType) -> Option<f64> {
        self.streaming_by_type
            .iter()
            .find(|(t, _)| *t == ty)
            .map(|(_, r)| *r)
    }

    /// The profile as TOML (what `--measure-host` saves).
    pub fn to_toml(&self) -> String {
        use std::fmt::Write as _;
        let q = |s: &str| toml::Value::String(s.to_owned()).to_string();
        let mut out = String::from("[[device]]\n");
        let _ = writeln!(out, "name = {}", q(&self.name));
        let _ = writeln!(out, "description = {}", q(&self.description));
        // `{:?}` is the shortest text that parses back to the same number
        // (and always a TOML float): rounding to a few decimals could turn a
        // valid profile into one that is refused (0.004 GB/s into 0.00).
        let _ = writeln!(out, "ram_gb = {:?}", self.ram_bytes as f64 / GIB);
        let _ = writeln!(
            out,
            "os_reserve_gb = {:?}",
            self.os_reserve_bytes as f64 / GIB
        );
        let _ = writeln!(out, "ram_bandwidth_gbs = {:?}", self.ram_bandwidth / 1e9);
        let _ = writeln!(
            out,
            "bandwidth_efficiency = {:?}",
            self.bandwidth_efficiency
        );
        let _ = writeln!(out, "storage_read_gbs = {:?}", self.storage_read / 1e9);
        let _ = writeln!(out, "threads = {}", self.threads);
        let _ = writeln!(out, "compute_gweights_s = {:?}", self.compute / 1e9);
        let _ = writeln!(out, "dispatch_us = {:?}", self.dispatch * 1e6);
        let _ = writeln!(out, "overlap_loss = {:?}", self.overlap_loss);
        if !self.streaming_by_type.is_empty() {
            let _ = writeln!(
                out,
                "cache_mb = {:?}",
                self.cache_bytes as f64 / (1u64 << 20) as f64
            );
        }
        if !self.compute_by_type.is_empty() {
            out.push_str("\n[device.compute]\n");
            for (t, r) in &self.compute_by_type {
                let _ = writeln!(out, "{} = {:?}", t.name(), r / 1e9);
            }
        }
        if !self.streaming_by_type.is_empty() {
            out.push_str("\n[device.streaming]\n");
            for (t, r) in &self.streaming_by_type {
                let _ = writeln!(out, "{} = {:?}", t.name(), r / 1e9);
            }
        }
        out
    }
}

/// Parses a profile file: `[[device]]` tables, or one profile at the top level.
pub fn parse_all(text: &str) -> Result<Vec<Device>, ProfileError> {
    let doc: toml::Table = text.parse()?;
    match doc.get("device") {
        Some(toml::Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let index = i + 1;
                let t = v.as_table().ok_or(ProfileError::NotATable { index })?;
                parse_one(t).map_err(|error| ProfileError::Device { index, error })
            })
            .collect(),
        Some(_) => Err(ProfileError::NotAnArray),
        None => Ok(vec![parse_one(&doc)?]),
    }
}

fn parse_one(t: &toml::Table) -> Result<Device, FieldError> {
    if let Some(k) = t.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(FieldError::UnknownKey { key: k.clone() });
    }
    let string = |key: &str| t.get(key).and_then(toml::Value::as_str).map(str::to_owned);
    let number = |key: &'static str, lo: f64, hi: f64| -> Result<f64, FieldError> {
        let value = match t.get(key) {
            Some(toml::Value::Float(f)) => *f,
            Some(toml::Value::Integer(i)) => *i as f64,
            Some(other) => {
                return Err(FieldError::NotANumber {
                    key,
                    found: other.type_str(),
                });
            }
            None => return Err(FieldError::Missing { key }),
        };
        if !(value.is_finite() && value >= lo && value <= hi) {
            return Err(FieldError::OutOfRange { key, value, lo, hi });
        }
        Ok(value)
    };
    let name = string("name").ok_or(FieldError::NoName)?;
    let ram = number("ram_gb", 0.125, 65536.0)?;
    let reserve = number("os_reserve_gb", 0.0, 65536.0)?;
    let (ram_bytes, os_reserve_bytes) = ((ram * GIB) as u64, (reserve * GIB) as u64);
    // Compared in bytes: two sizes a few bytes apart are the same once rounded.
    if os_reserve_bytes >= ram_bytes {
        return Err(FieldError::ReserveTooLarge { reserve, ram });
    }
    let rates = |key: &'static str| -> Result<Vec<(GgmlType, f64)>, FieldError> {
        let mut out = Vec::new();
        match t.get(key) {
            None => {}
            Some(toml::Value::Table(c)) => {
                for (k, v) in c {
                    let ty = parse_type(k).map_err(|error| FieldError::RateType { key, error })?;
                    let r = v
                        .as_float()
                        .or_else(|| v.as_integer().map(|i| i as f64))
                        .filter(|r| r.is_finite() && *r > 0.0 && *r < 1e6)
                        .ok_or_else(|| FieldError::BadRate { key, ty: k.clone() })?;
                    out.push((ty, r * 1e9));
                }
            }
            Some(_) => return Err(FieldError::NotARateTable { key }),
        }
        Ok(out)
    };
    let compute_by_type = rates("compute")?;
    let streaming_by_type = rates("streaming")?;
    Ok(Device {
        description: string("description").unwrap_or_default(),
        ram_bytes,
        os_reserve_bytes,
        ram_bandwidth: number("ram_bandwidth_gbs", 0.01, 1e5)? * 1e9,
        bandwidth_efficiency: number("bandwidth_efficiency", 0.01, 1.0)?,
        storage_read: number("storage_read_gbs", 0.001, 1e4)? * 1e9,
        threads: number("threads", 1.0, 1024.0)? as u32,
        compute: number("compute_gweights_s", 0.001, 1e6)? * 1e9,
        compute_by_type,
        dispatch: match t.get("dispatch_us") {
            None => DEFAULT_DISPATCH,
            // Divided, not multiplied by 1e-6: `to_toml` multiplies back exactly.
            Some(_) => number("dispatch_us", 0.0, 1e5)? / 1e6,
        },
        overlap_loss: match t.get("overlap_loss") {
            None => 0.0,
            Some(_) => number("overlap_loss", 0.0, 1.0)?,
        },
        cache_bytes: match t.get("cache_mb") {
            None => 32 << 20,
            Some(_) => (number("cache_mb", 0.0, 1e6)? * (1u64 << 20) as f64) as u64,
        },
        streaming_by_type,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_and_leave_ten_to_twelve_gb_on_a_16_gb_phone() {
        let all = parse_all(BUILTIN).unwrap();
        let names: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["phone-8gb", "phone-12gb", "phone-16gb", "phone-24gb"]
        );
        let p16 = Device::resolve("phone-16gb").unwrap();
        let free = p16.usable_bytes() as f64 / GIB;
        assert!((10.0..=12.0).contains(&free), "{free}");
    }

    #[test]
    fn profiles_round_trip_through_toml() {
        let mut d = Device::resolve("phone-12gb").unwrap();
        d.compute_by_type = vec![(GgmlType::Q4_K, 9.5e9), (GgmlType::F16, 4e9)];
        let back = parse_all(&d.to_toml()).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].name, d.name);
        assert_eq!(back[0].threads, d.threads);
        assert!((back[0].ram_bandwidth - d.ram_bandwidth).abs() < 1e7);
        assert_eq!(back[0].compute_for(GgmlType::Q4_K), 9.5e9);
        assert_eq!(back[0].compute_for(GgmlType::Q8_0), d.compute);
    }

    #[test]
    fn bad_profiles_name_the_field() {
        let base = "name = \"x\"\nram_gb = 8\nos_reserve_gb = 2\nram_bandwidth_gbs = 30\n\
                    bandwidth_efficiency = 0.6\nstorage_read_gbs = 1\nthreads = 4\ncompute_gweights_s = 5\n";
        assert!(parse_all(base).is_ok());
        for (edit, want) in [
            ("ram_gb = 8", "ram_gb = -1"),
            ("os_reserve_gb = 2", "os_reserve_gb = 9"),
            ("threads = 4", "threads = \"four\""),
            ("bandwidth_efficiency = 0.6", "bandwidth_efficiency = nan"),
            ("name = \"x\"", "name = \"x\"\nspeed = 3"),
        ] {
            let text = base.replace(edit, want);
            let err = parse_all(&text).unwrap_err().to_string();
            let key = want
                .split(' ')
                .next()
                .unwrap()
                .trim_start_matches("name = \"x\"\n");
            assert!(err.contains(key), "{want}: {err}");
        }
        assert!(
            Device::resolve("phone-99gb")
                .unwrap_err()
                .to_string()
                .contains("phone-16gb")
        );
    }
}
