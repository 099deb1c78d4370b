//! Labelled scatter charts with plotters, as SVG and PNG.
//!
//! The SVG needs no font: its text is left to the viewer, and the chart is laid
//! out without measuring text (fixed label areas, the title drawn at a fixed
//! place, labels only left of and below the plot). The PNG is rasterized here,
//! so it needs a TrueType/OpenType font: [`use_font`] registers the one given
//! with `--font` or the first of [`FONT_CANDIDATES`] that exists.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Fonts looked for when none is given: Debian/Ubuntu (`fonts-dejavu-core`,
/// `fonts-liberation`, `fonts-noto-core`, `fonts-freefont-ttf`), Arch, Fedora,
/// Android, macOS and Windows.
pub const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/google-noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/system/fonts/Roboto-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Helvetica.ttc",
    "C:\\Windows\\Fonts\\arial.ttf",
    "C:\\Windows\\Fonts\\segoeui.ttf",
];

/// The family every text of the charts uses (the registered font).
const FAMILY: &str = "sans-serif";
const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;

/// The font registered with plotters, if any.
static REGISTERED: Mutex<Option<PathBuf>> = Mutex::new(None);

fn register(path: &Path) -> Result<()> {
    let bytes =
        std::fs::read(path).with_context(|| format!("{}: cannot read the font", path.display()))?;
    // plotters keeps fonts for the life of the process; one leak per font file.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).map_err(|_| {
        anyhow!(
            "{}: not a TrueType or OpenType font (give a .ttf with --font)",
            path.display()
        )
    })?;
    let mut slot = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    *slot = Some(path.to_owned());
    Ok(())
}

/// Makes a font available for PNG text: `explicit` (an error when it cannot be
/// used), else the one already registered, else the first usable candidate.
/// `None` when there is none.
pub fn use_font(explicit: Option<&Path>) -> Result<Option<PathBuf>> {
    if let Some(path) = explicit {
        let current = REGISTERED.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if current.as_deref() != Some(path) {
            register(path)?;
        }
        return Ok(Some(path.to_owned()));
    }
    if let Some(path) = REGISTERED.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        return Ok(Some(path));
    }
    for candidate in FONT_CANDIDATES.iter().map(Path::new) {
        if candidate.is_file() && register(candidate).is_ok() {
            return Ok(Some(candidate.to_owned()));
        }
    }
    Ok(None)
}

/// One labelled point.
#[derive(Clone, Debug)]
pub struct Point {
    /// Text beside the marker.
    pub label: String,
    /// Horizontal value.
    pub x: f64,
    /// Vertical value.
    pub y: f64,
}

/// A scatter chart: one marker (an SVG `<circle>`) per point, nothing else round.
#[derive(Clone, Debug)]
pub struct Scatter {
    /// Title, top centre.
    pub title: String,
    /// A line under the title (what is plotted, what is not).
    pub caption: String,
    /// Horizontal axis description.
    pub x_desc: String,
    /// Vertical axis description.
    pub y_desc: String,
    /// The points.
    pub points: Vec<Point>,
    /// A labelled vertical reference line at this x (drawn, no marker).
    pub reference: Option<(f64, String)>,
}

impl Scatter {
    /// Whether the vertical axis is logarithmic: every value positive and
    /// spanning more than 10×.
    pub fn log_y(&self) -> bool {
        let (lo, hi) = self.y_span();
        self.points.iter().all(|p| p.y > 0.0) && lo > 0.0 && hi / lo > 10.0
    }

    fn y_span(&self) -> (f64, f64) {
        let ys = self.points.iter().map(|p| p.y).filter(|y| y.is_finite());
        let lo = ys.clone().fold(f64::INFINITY, f64::min);
        let hi = ys.fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) }
    }

    fn x_max(&self) -> f64 {
        let hi = self
            .points
            .iter()
            .map(|p| p.x)
            .chain(self.reference.as_ref().map(|r| r.0))
            .filter(|x| x.is_finite())
            .fold(0.0, f64::max);
        if hi > 0.0 { hi * 1.12 } else { 1.0 }
    }
}

/// The chart as an SVG document (no font needed).
pub fn svg(chart: &Scatter) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        draw(&root, chart)?;
        root.present().map_err(plot_error)?;
    }
    Ok(out)
}

/// Rasterizes the chart to a PNG at `path`, written beside it first and
/// renamed into place. Needs a font ([`use_font`]).
pub fn png(chart: &Scatter, path: &Path) -> Result<()> {
    // The encoder picks the format from the extension, so the scratch name ends in .png.
    let scratch = path.with_extension("partial.png");
    let _listed = memwall_format::cleanup::register_file(&scratch);
    let result = (|| -> Result<()> {
        {
            let root = BitMapBackend::new(&scratch, (WIDTH, HEIGHT)).into_drawing_area();
            draw(&root, chart)?;
            root.present().map_err(plot_error)?;
        }
        std::fs::File::open(&scratch)?.sync_all()?;
        std::fs::rename(&scratch, path)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&scratch);
    }
    result.with_context(|| format!("{}: writing the chart", path.display()))
}

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Scatter) -> Result<()> {
    root.fill(&WHITE).map_err(plot_error)?;
    let (header, body) = root.split_vertically(76);
    let centre = (WIDTH / 2) as i32;
    let title = (FAMILY, 24)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    header
        .draw_text(&chart.title, &title, (centre, 12))
        .map_err(plot_error)?;
    let caption = (FAMILY, 15)
        .into_font()
        .color(&RGBColor(80, 80, 80))
        .pos(Pos::new(HPos::Center, VPos::Top));
    header
        .draw_text(&chart.caption, &caption, (centre, 46))
        .map_err(plot_error)?;
    let x = 0.0..chart.x_max();
    let (lo, hi) = chart.y_span();
    if chart.log_y() {
        plot(
            &body,
            chart,
            x,
            (lo / 2.0..hi * 2.0).log_scale(),
            (lo / 2.0, hi * 2.0),
        )
    } else {
        let top = if hi > 0.0 { hi * 1.15 } else { 1.0 };
        plot(&body, chart, x, 0.0..top, (0.0, top))
    }
}

fn plot<DB: DrawingBackend, Y>(
    area: &DrawingArea<DB, Shift>,
    chart: &Scatter,
    x: std::ops::Range<f64>,
    y: Y,
    (y_lo, y_hi): (f64, f64),
) -> Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let x_max = x.end;
    let xd = decimals(x.end - x.start);
    let yd = decimals(y_hi - y_lo);
    let log = chart.log_y();
    let mut ctx = ChartBuilder::on(area)
        .margin_left(16)
        .margin_right(40)
        .margin_bottom(12)
        .x_label_area_size(56)
        .y_label_area_size(96)
        .build_cartesian_2d(x, y)
        .map_err(plot_error)?;
    ctx.configure_mesh()
        .x_desc(chart.x_desc.as_str())
        .y_desc(chart.y_desc.as_str())
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .x_label_formatter(&|v| format!("{v:.xd$}"))
        .y_label_formatter(&|v| if log { tick(*v) } else { format!("{v:.yd$}") })
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(plot_error)?;
    if let Some((at, label)) = &chart.reference {
        let grey = RGBColor(150, 150, 150);
        ctx.draw_series(std::iter::once(PathElement::new(
            vec![(*at, y_lo), (*at, y_hi)],
            grey.stroke_width(2),
        )))
        .map_err(plot_error)?;
        let style = (FAMILY, 14)
            .into_font()
            .color(&grey)
            .pos(Pos::new(HPos::Right, VPos::Top));
        ctx.draw_series(std::iter::once(Text::new(
            label.clone(),
            (*at, y_hi),
            style,
        )))
        .map_err(plot_error)?;
    }
    let marker = RGBColor(31, 119, 180);
    let at: Vec<(i32, i32)> = chart
        .points
        .iter()
        .map(|p| ctx.backend_coord(&(p.x, p.y)))
        .collect();
    let offsets = label_offsets(chart, x_max, &at);
    ctx.draw_series(chart.points.iter().zip(offsets).map(|(p, (offset, h))| {
        let style = (FAMILY, LABEL_SIZE)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(h, VPos::Bottom));
        EmptyElement::at((p.x, p.y))
            + Circle::new((0, 0), 6, marker.filled())
            + Text::new(p.label.clone(), offset, style)
    }))
    .map_err(plot_error)?;
    Ok(())
}

/// Font size of the point labels, in pixels.
const LABEL_SIZE: i32 = 15;
/// A label's height and a generous width per character (text is not measured,
/// so that the SVG needs no font).
const LABEL_HEIGHT: i32 = LABEL_SIZE + 3;
const LABEL_CHAR_WIDTH: i32 = 9;

/// Where each label goes relative to its marker (at pixel `at`): right of it,
/// or left of it near the right edge, its bottom 6 pixels above the marker's
/// centre; a label that would overlap one placed before (points of the same
/// size and quality sit on top of each other) moves down or up a line at a
/// time until it is clear.
fn label_offsets(chart: &Scatter, x_max: f64, at: &[(i32, i32)]) -> Vec<((i32, i32), HPos)> {
    let mut order: Vec<usize> = (0..chart.points.len()).collect();
    order.sort_by_key(|&i| (at[i].1, at[i].0));
    let mut placed: Vec<(i32, i32, i32, i32)> = Vec::new();
    let mut result = vec![((0, 0), HPos::Left); chart.points.len()];
    for i in order {
        let p = &chart.points[i];
        let width = LABEL_CHAR_WIDTH * p.label.chars().count() as i32;
        let (dx, h) = if p.x > 0.75 * x_max {
            (-10, HPos::Right)
        } else {
            (10, HPos::Left)
        };
        let (x0, x1) = match h {
            HPos::Right => (at[i].0 + dx - width, at[i].0 + dx),
            _ => (at[i].0 + dx, at[i].0 + dx + width),
        };
        let clear = |bottom: i32| {
            let (y0, y1) = (bottom - LABEL_HEIGHT, bottom);
            placed
                .iter()
                .all(|&(a0, a1, b0, b1)| x1 <= a0 || a1 <= x0 || y1 <= b0 || b1 <= y0)
        };
        let dy = (0..64)
            .map(|k: i32| -6 + if k % 2 == 1 { k / 2 + 1 } else { -(k / 2) } * LABEL_HEIGHT)
            .find(|&dy| clear(at[i].1 + dy))
            .unwrap_or(-6);
        let bottom = at[i].1 + dy;
        placed.push((x0, x1, bottom - LABEL_HEIGHT, bottom));
        result[i] = ((dx, dy), h);
    }
    result
}

/// Decimals that tell apart the ticks of a linear axis spanning `span`
/// (plotters puts 5 to 10 ticks on it).
fn decimals(span: f64) -> usize {
    if span > 0.0 && span.is_finite() {
        (-(span / 5.0).log10().floor()).clamp(0.0, 8.0) as usize
    } else {
        0
    }
}

/// A label of a logarithmic axis: its leading digit's place and no further
/// (`0.1`, `0.01`, `0.05`, `20`).
fn tick(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return "0".into();
    }
    let decimals = (-v.abs().log10().floor()).clamp(0.0, 12.0) as usize;
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(ys: &[f64]) -> Scatter {
        Scatter {
            title: "t".into(),
            caption: "c".into(),
            x_desc: "x".into(),
            y_desc: "y".into(),
            points: ys
                .iter()
                .enumerate()
                .map(|(i, &y)| Point {
                    label: format!("p{i}"),
                    x: i as f64 + 1.0,
                    y,
                })
                .collect(),
            reference: Some((5.0, "ref".into())),
        }
    }

    #[test]
    fn svg_needs_no_font_and_has_one_circle_per_point() {
        // No font is registered in this test: the SVG must not measure text.
        let svg = svg(&chart(&[0.5, 0.01, 0.002])).unwrap();
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains(">p1<") || svg.contains("p1\n"));
    }

    /// The y of each `<text>` holding one of `labels`, in the SVG.
    fn label_ys(svg: &str, labels: &[&str]) -> Vec<f64> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        labels
            .iter()
            .map(|label| {
                doc.descendants()
                    .find(|n| n.has_tag_name("text") && n.text().map(str::trim) == Some(*label))
                    .and_then(|n| n.attribute("y"))
                    .unwrap_or_else(|| panic!("no label {label}"))
                    .parse()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn labels_of_points_on_top_of_each_other_do_not_overlap() {
        // Q4_K_M and its calibrated twin: the same size, nearly the same KLD.
        let mut c = chart(&[0.0055, 0.0054, 0.002]);
        c.points[0].label = "tiny-zh-Q4_K_M".into();
        c.points[1].label = "tiny-zh-Q4_K_M-awq-gptq".into();
        c.points[1].x = c.points[0].x;
        let ys = label_ys(
            &svg(&c).unwrap(),
            &["tiny-zh-Q4_K_M", "tiny-zh-Q4_K_M-awq-gptq"],
        );
        assert!(
            (ys[0] - ys[1]).abs() >= f64::from(LABEL_SIZE),
            "labels at y {ys:?} overlap"
        );
        // Points far apart keep their labels beside them.
        let apart = chart(&[0.5, 0.01, 0.002]);
        let ys = label_ys(&svg(&apart).unwrap(), &["p0", "p1", "p2"]);
        assert!(ys.windows(2).all(|w| w[0] != w[1]), "{ys:?}");
    }

    #[test]
    fn log_scale_only_for_positive_values_spanning_a_decade() {
        assert!(chart(&[0.5, 0.01]).log_y());
        assert!(!chart(&[0.5, 0.1]).log_y());
        assert!(!chart(&[0.5, 0.0]).log_y());
    }

    #[test]
    fn linear_ticks_get_the_decimals_of_their_step() {
        assert_eq!(decimals(0.0072), 3);
        assert_eq!(decimals(13.7), 0);
        assert_eq!(decimals(1.0), 1);
    }

    #[test]
    fn log_ticks_stop_at_the_leading_digit() {
        assert_eq!(tick(0.1), "0.1");
        assert_eq!(tick(0.001), "0.001");
        assert_eq!(tick(0.05), "0.05");
        assert_eq!(tick(20.0), "20");
        assert_eq!(tick(0.0), "0");
    }
}
