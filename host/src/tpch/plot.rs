//! `dfx tpch --plot FILE.svg`: each query's median time, three bars side by
//! side (stock DataFusion, dfx's session in one process, distributed).

use std::path::Path;

use plotters::prelude::*;

use super::TpchError;
use super::report::RunReport;

/// The three ways each query ran, in bar order: label, colour and the
/// figure taken from a query's row.
type Series = (
    &'static str,
    RGBColor,
    fn(&super::report::QueryReport) -> Option<f64>,
);

const SERIES: [Series; 3] = [
    ("stock DataFusion", RGBColor(120, 120, 120), |q| q.stock_ms),
    ("dfx, one process", RGBColor(66, 133, 244), |q| q.local_ms),
    ("dfx, distributed", RGBColor(219, 68, 55), |q| {
        q.distributed_ms
    }),
];

/// Draw `report` as a grouped bar chart into the SVG file `path`.
///
/// A query that did not run some way has no bar there; a report with no
/// timed query still gives a (captioned, empty) chart rather than an error.
///
/// # Errors
/// The file cannot be written.
pub fn write_svg(report: &RunReport, path: &Path) -> Result<(), TpchError> {
    draw(report, path).map_err(|e| {
        TpchError::Invalid(format!(
            "cannot draw the chart into {}: {e}",
            path.display()
        ))
    })
}

fn draw(report: &RunReport, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let queries = &report.queries;
    let groups = queries.len().max(1);
    let tallest = queries
        .iter()
        .flat_map(|q| SERIES.iter().filter_map(move |(_, _, value)| value(q)))
        .fold(0.0_f64, f64::max);
    let top = if tallest > 0.0 { tallest * 1.1 } else { 1.0 };
    let width = (120 + 60 * groups as u32).max(480);

    let root = SVGBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "TPC-H sf{}, {} partitions, split {}: median ms of {} run(s)",
        report.scale, report.partitions, report.split, report.runs
    );
    // One group per query, centred on the integer i, so the axis's whole
    // numbers are exactly the places to label.
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..groups as f64 - 0.5, 0.0..top)?;
    let label_of = |x: &f64| {
        let i = x.round();
        match queries.get(i as usize) {
            Some(q) if (x - i).abs() < 1e-6 && i >= 0.0 => format!("q{}", q.query),
            _ => String::new(),
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups)
        .x_label_formatter(&label_of)
        .y_desc("milliseconds")
        .draw()?;

    let bar = 0.8 / SERIES.len() as f64;
    for (k, (label, colour, value)) in SERIES.iter().enumerate() {
        let bars = queries.iter().enumerate().filter_map(|(i, q)| {
            let left = i as f64 - 0.4 + k as f64 * bar;
            value(q).map(|ms| Rectangle::new([(left, 0.0), (left + bar, ms)], colour.filled()))
        });
        let colour = *colour;
        chart
            .draw_series(bars)?
            .label(*label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{ShuffleCompression, Split};
    use crate::tpch::report::{Outcome, QueryReport};

    fn row(query: u8, times: [Option<f64>; 3]) -> QueryReport {
        QueryReport {
            query,
            rows: Some(1),
            stock_ms: times[0],
            local_ms: times[1],
            distributed_ms: times[2],
            ratio: None,
            stages: None,
            tasks: None,
            decisions: Vec::new(),
            outcome: Outcome::Agree,
        }
    }

    #[test]
    fn one_bar_per_query_and_way_that_ran() {
        let report = RunReport::new(
            1.0,
            2,
            Split::Exchange,
            ShuffleCompression::Lz4,
            3,
            vec![
                row(1, [Some(100.0), Some(120.0), Some(150.0)]),
                row(9, [Some(300.0), None, Some(500.0)]),
            ],
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.svg");
        write_svg(&report, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        // Five bars and three legend swatches are filled rectangles.
        let filled_bars = ["#787878", "#4285F4", "#DB4437"]
            .iter()
            .map(|colour| svg.matches(&format!("fill=\"{colour}\"")).count())
            .collect::<Vec<_>>();
        assert_eq!(filled_bars, vec![2 + 1, 1 + 1, 2 + 1], "{svg}");
        for text in ["q1", "q9", "stock DataFusion", "dfx, distributed"] {
            assert!(svg.contains(text), "no {text:?} in the chart");
        }
    }
}
