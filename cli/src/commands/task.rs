//! `ctxwin task start "goal"` / `ctxwin task done [OUTCOME]` / `ctxwin task list`: task
//! boundaries, and per task how much its summary compressed it.

use serde_json::{Value, json};

use crate::args::{TaskAction, TaskArgs};
use crate::error::CliError;
use crate::output::Output;
use ctxwin_std::session::{Session, TASK_RATIO_WARNING, TaskRatio};

pub(crate) fn run(session: &mut Session, args: &TaskArgs) -> Result<Output, CliError> {
    match &args.action {
        TaskAction::Start { goal } => {
            let finished = session.current_task().map(|task| task.number());
            let number = session.start_task(goal)?;
            let mut text = String::new();
            if let Some(done) = finished {
                text.push_str(&format!("task {done} finished\n"));
            }
            text.push_str(&format!("task {number} started: {goal}\n"));
            Ok(Output::Report { text, json: json!({"started": number, "finished": finished}) })
        }
        TaskAction::Done { outcome } => {
            let task = session.finish_task(outcome.as_deref().unwrap_or(""))?;
            let stats = session.stats()?;
            let ratio = stats.tasks.tasks.iter().find(|t| t.number == task.number()).cloned();
            let line = ratio.as_ref().map_or_else(String::new, describe);
            let text = format!("task {} finished: {line}\n", task.number());
            Ok(Output::Report { text, json: json!({"finished": ratio.map(|r| to_json(&r))}) })
        }
        TaskAction::List => {
            let stats = session.stats()?;
            let mut text = format!(
                "detection: {} ({})\n",
                stats.tasks.detection, stats.tasks.detection_explained
            );
            for task in &stats.tasks.tasks {
                text.push_str(&format!("task {}: {}\n", task.number, describe(task)));
            }
            if stats.tasks.tasks.is_empty() {
                text.push_str("no tasks: `ctxwin task start \"goal\"` starts one\n");
            }
            let list: Vec<Value> = stats.tasks.tasks.iter().map(to_json).collect();
            Ok(Output::Report {
                text,
                json: json!({"detection": stats.tasks.detection, "tasks": list}),
            })
        }
    }
}

/// One task in a line: its goal and compression, with the warning under 2×.
fn describe(task: &TaskRatio) -> String {
    match (task.open, task.ratio) {
        (true, _) => format!("{:?}, running", task.goal),
        (false, None) => format!("{:?}, no summary (no message of it was left)", task.goal),
        (false, Some(ratio)) => format!(
            "{:?}, {} -> {} tokens ({ratio:.1}x){}",
            task.goal,
            task.source_tokens,
            task.summary_tokens,
            if ratio < TASK_RATIO_WARNING {
                "; warning: under 2x, the summary keeps too much detail"
            } else {
                ""
            }
        ),
    }
}

fn to_json(task: &TaskRatio) -> Value {
    json!({
        "number": task.number,
        "goal": task.goal,
        "open": task.open,
        "source_tokens": task.source_tokens,
        "summary_tokens": task.summary_tokens,
        "ratio": task.ratio,
        "warning": task.warning,
    })
}
