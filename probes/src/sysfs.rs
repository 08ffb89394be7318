//! AMD GPUs from the amdgpu driver's sysfs files, for hosts without `librocm_smi64`:
//! `/sys/class/drm/card*/device/{vendor, mem_info_vram_used, mem_info_vram_total,
//! gpu_busy_percent, unique_id, hwmon/hwmon*/{power1_average|power1_input, temp1_input}}`.
//! There is no energy counter here, so windows integrate power instead (and say so). The root is
//! injectable so tests use a temp tree.
use crate::gpu::{GpuError, GpuProbe, GpuSample, Want};
use std::path::{Path, PathBuf};

const AMD_VENDOR: &str = "0x1002";

pub struct SysfsProbe {
    devices: Vec<PathBuf>,
}

impl SysfsProbe {
    /// Find the AMD GPUs under `root` (normally `/sys`), in card order.
    pub fn open(root: &Path) -> Result<Self, GpuError> {
        let drm = root.join("class/drm");
        let entries = std::fs::read_dir(&drm).map_err(|e| GpuError::Unavailable {
            backend: "sysfs",
            why: format!("{}: {e}", drm.display()),
        })?;
        let mut cards: Vec<(u32, PathBuf)> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                // card0, card1, ... (not card0-DP-1 connectors, not renderD128)
                let n: u32 = name.strip_prefix("card")?.parse().ok()?;
                let dev = e.path().join("device");
                let vendor = std::fs::read_to_string(dev.join("vendor")).ok()?;
                (vendor.trim() == AMD_VENDOR).then_some((n, dev))
            })
            .collect();
        cards.sort();
        Ok(SysfsProbe {
            devices: cards.into_iter().map(|(_, d)| d).collect(),
        })
    }
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// The first `hwmon/hwmon*/<file>` that reads as a number.
fn hwmon(dev: &Path, file: &str) -> Option<u64> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dev.join("hwmon"))
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    dirs.sort();
    dirs.iter().find_map(|d| read_u64(&d.join(file)))
}

impl GpuProbe for SysfsProbe {
    fn backend(&self) -> &'static str {
        "sysfs"
    }

    fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    fn sample(&self, index: u32, want: Want) -> Result<GpuSample, GpuError> {
        let dev = self
            .devices
            .get(index as usize)
            .ok_or_else(|| GpuError::Gone {
                index,
                why: "no such card".into(),
            })?;
        if !dev.join("vendor").exists() {
            return Err(GpuError::Gone {
                index,
                why: format!("{} disappeared", dev.display()),
            });
        }
        let mut s = GpuSample {
            index,
            ..GpuSample::default()
        };
        if want.identity {
            s.uuid = std::fs::read_to_string(dev.join("unique_id"))
                .ok()
                .map(|u| u.trim().to_string())
                .filter(|u| !u.is_empty());
            s.name = std::fs::read_to_string(dev.join("product_name"))
                .ok()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty());
        }
        // µW. power1_input is the instant reading where the ASIC has it; power1_average otherwise.
        s.power_w = hwmon(dev, "power1_input").map(|uw| uw as f64 / 1e6);
        s.power_avg_w = hwmon(dev, "power1_average").map(|uw| uw as f64 / 1e6);
        s.temperature_c = hwmon(dev, "temp1_input").map(|mc| mc as f64 / 1000.0);
        s.memory_used_bytes = read_u64(&dev.join("mem_info_vram_used"));
        s.memory_total_bytes = read_u64(&dev.join("mem_info_vram_total"));
        s.utilization = read_u64(&dev.join("gpu_busy_percent")).map(|p| p as f64 / 100.0);
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "sglsup-sysfs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let card = |n: u32, vendor: &str| {
            let d = root.join(format!("class/drm/card{n}/device"));
            std::fs::create_dir_all(d.join("hwmon/hwmon3")).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            d
        };
        let amd = card(1, AMD_VENDOR);
        std::fs::write(amd.join("hwmon/hwmon3/power1_average"), "250000000\n").unwrap();
        std::fs::write(amd.join("hwmon/hwmon3/temp1_input"), "45000\n").unwrap();
        std::fs::write(amd.join("mem_info_vram_used"), "1073741824\n").unwrap();
        std::fs::write(amd.join("mem_info_vram_total"), "274877906944\n").unwrap();
        std::fs::write(amd.join("gpu_busy_percent"), "37\n").unwrap();
        std::fs::write(amd.join("unique_id"), "8f1c2a3b4d5e6f70\n").unwrap();
        card(0, "0x10de"); // an NVIDIA card: not ours
        std::fs::create_dir_all(root.join("class/drm/card1-DP-1")).unwrap();
        root
    }

    #[test]
    fn reads_amd_cards_and_skips_others() {
        let root = tree();
        let p = SysfsProbe::open(&root).unwrap();
        assert_eq!(p.device_count(), 1);
        let s = p.sample(0, Want::ALL).unwrap();
        assert_eq!(s.power_avg_w, Some(250.0));
        assert_eq!(
            s.power_w, None,
            "no power1_input on this ASIC: absent, not 0"
        );
        assert_eq!(s.energy_j, None, "sysfs has no energy counter");
        assert_eq!(s.temperature_c, Some(45.0));
        assert_eq!(s.memory_used_bytes, Some(1 << 30));
        assert_eq!(s.utilization, Some(0.37));
        assert_eq!(s.uuid.as_deref(), Some("8f1c2a3b4d5e6f70"));
        std::fs::remove_dir_all(root.join("class/drm/card1")).unwrap();
        assert!(
            matches!(p.sample(0, Want::ALL), Err(GpuError::Gone { .. })),
            "a card that disappears is gone"
        );
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_missing_tree_is_unavailable() {
        assert!(matches!(
            SysfsProbe::open(Path::new("/nonexistent")),
            Err(GpuError::Unavailable { .. })
        ));
    }
}
