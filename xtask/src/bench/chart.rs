//! The rate sweep drawn as a PNG: delivered throughput, and p50/p99 latency, against the
//! offered rate, so a regression shows at a glance.
//!
//! The text needs a TrueType font; the chart uses DejaVu Sans (Debian's `fonts-dejavu-core`)
//! or Liberation Sans where the machine has one, and says so when it has neither.

use std::path::Path;

use anyhow::{Context as _, anyhow};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// One offered rate of the sweep.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SweepPoint {
    pub(crate) offered: f64,
    pub(crate) delivered: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
}

/// Where a sans-serif TrueType font is found on common Linux systems.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

const FAMILY: &str = "sans-serif";

/// Registers the first font found, once per process.
fn register() -> anyhow::Result<()> {
    static REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let Some(bytes) = FONTS.iter().find_map(|path| std::fs::read(path).ok()) else {
                return Err(format!(
                    "no TrueType font found (looked for {}); install fonts-dejavu-core",
                    FONTS.join(", ")
                ));
            };
            // Registered fonts live as long as the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            register_font(FAMILY, FontStyle::Normal, bytes)
                .map_err(|_| "the font file could not be read as a font".to_owned())
        })
        .clone()
        .map_err(|message| anyhow!(message))
}

/// Draws `points` (sorted by offered rate) to `path`.
pub(crate) fn draw(path: &Path, title: &str, points: &[SweepPoint]) -> anyhow::Result<()> {
    register()?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let root = BitMapBackend::new(path, (1000, 800)).into_drawing_area();
    draw_on(&root, title, points).map_err(|error| anyhow!("drawing the chart failed: {error}"))?;
    root.present()
        .map_err(|error| anyhow!("writing {} failed: {error}", path.display()))
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw_on(
    root: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    title: &str,
    points: &[SweepPoint],
) -> DrawResult {
    root.fill(&WHITE)?;
    let root = root.titled(title, (FAMILY, 22))?;
    let (upper, lower) = root.split_vertically(400);
    let max_rate = points
        .iter()
        .map(|point| point.offered.max(point.delivered))
        .fold(1.0_f64, f64::max)
        * 1.05;

    let mut throughput = ChartBuilder::on(&upper)
        .margin(12)
        .caption("delivered calls/s against offered", (FAMILY, 16))
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_rate, 0.0..max_rate)?;
    throughput
        .configure_mesh()
        .x_desc("offered calls/s")
        .y_desc("delivered calls/s")
        .x_label_formatter(&|rate| format!("{rate:.0}"))
        .y_label_formatter(&|rate| format!("{rate:.0}"))
        .label_style((FAMILY, 13))
        .draw()?;
    throughput
        .draw_series(LineSeries::new(
            [(0.0, 0.0), (max_rate, max_rate)],
            BLACK.mix(0.25),
        ))?
        .label("offered = delivered")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.mix(0.25)));
    let delivered: Vec<(f64, f64)> = points
        .iter()
        .map(|point| (point.offered, point.delivered))
        .collect();
    plot(&mut throughput, "delivered", BLUE, &delivered)?;
    legend(&mut throughput)?;

    let max_latency = points
        .iter()
        .map(|point| point.p99_ms.max(point.p50_ms))
        .fold(1.0_f64, f64::max)
        * 1.5;
    let min_latency = points
        .iter()
        .map(|point| point.p50_ms)
        .fold(max_latency, f64::min)
        .max(0.01)
        / 1.5;
    let mut latency = ChartBuilder::on(&lower)
        .margin(12)
        .caption(
            "latency from each call's scheduled send (ms, log scale)",
            (FAMILY, 16),
        )
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_rate, (min_latency..max_latency).log_scale())?;
    latency
        .configure_mesh()
        .x_desc("offered calls/s")
        .y_desc("ms")
        .x_label_formatter(&|rate| format!("{rate:.0}"))
        .y_label_formatter(&|ms| format!("{ms}"))
        .label_style((FAMILY, 13))
        .draw()?;
    for (name, color, pick) in [
        (
            "p50",
            GREEN,
            (|point: &SweepPoint| point.p50_ms) as fn(&SweepPoint) -> f64,
        ),
        ("p99", RED, |point: &SweepPoint| point.p99_ms),
    ] {
        let line: Vec<(f64, f64)> = points
            .iter()
            .map(|point| (point.offered, pick(point).max(min_latency)))
            .collect();
        plot(&mut latency, name, color, &line)?;
    }
    legend(&mut latency)?;
    Ok(())
}

/// One measured series: a line through its points, marked, with its legend entry.
fn plot<'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    name: &str,
    color: RGBColor,
    line: &[(f64, f64)],
) -> DrawResult {
    chart
        .draw_series(LineSeries::new(line.iter().copied(), color.stroke_width(2)))?
        .label(name)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    chart.draw_series(
        line.iter()
            .map(|&point| Circle::new(point, 4, color.filled())),
    )?;
    Ok(())
}

/// The legend box, top left.
fn legend<'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
) -> DrawResult {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 13))
        .border_style(BLACK.mix(0.3))
        .background_style(WHITE.mix(0.9))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart is a real PNG of the promised size (skipped, saying why, without a font).
    #[test]
    fn a_sweep_is_drawn_as_a_png() {
        if let Err(error) = register() {
            eprintln!("skipped: {error}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.png");
        let points = [
            SweepPoint {
                offered: 500.0,
                delivered: 498.0,
                p50_ms: 0.8,
                p99_ms: 2.5,
            },
            SweepPoint {
                offered: 5000.0,
                delivered: 4200.0,
                p50_ms: 40.0,
                p99_ms: 300.0,
            },
        ];
        draw(&path, "test", &points).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian, after the signature and the chunk header.
        assert_eq!(&bytes[16..24], &[0, 0, 0x03, 0xe8, 0, 0, 0x03, 0x20]);
    }
}
