//! A message that opens a task (issue 30, detection): the task starts only if the message is
//! taken, at that message, and a refused message changes nothing.
#![cfg(feature = "tasks")]

use ctxwin_core::{
    Config, ContextManager, DefaultCapacities, Error, Message, TinyCapacities, ToolCall,
};

type Manager = ContextManager<DefaultCapacities>;

#[test]
fn a_taken_message_opens_the_task_and_the_previous_one_ends_before_it() {
    let mut m = Manager::with_config(Config::DEFAULT).unwrap();
    let ask =
        m.push_opening_task(Message::user("List the crates").at(1), "List the crates").unwrap();
    let calls = [ToolCall::new("c1", "ls", "{}")];
    m.push(Message::assistant("").with_tool_calls(&calls).at(2)).unwrap();
    m.push(Message::tool_result("c1", "core cli proxy").at(3)).unwrap();
    let answer = m.push(Message::assistant("Three crates: core, cli, proxy.").at(4)).unwrap();
    let next = m.push_opening_task(Message::user("Now bump the version").at(5), "bump").unwrap();
    let tasks = m.tasks();
    assert_eq!(tasks.len(), 2);
    assert_eq!((tasks[0].first_id(), tasks[0].last_id()), (ask, Some(answer)));
    assert_eq!((tasks[1].first_id(), tasks[1].goal()), (next, "bump"));
    assert!(tasks[1].is_open() && tasks[1].contains(next));
    assert!(tasks[0].summary_id().is_some(), "the first task left its summary");
    assert_eq!(m.get(next).map(|r| r.content()), Some("Now bump the version"));
    assert_eq!(m.task_of(next).map(|t| t.number()), Some(2));
}

#[test]
fn a_refused_message_starts_no_task_and_changes_nothing() {
    let mut m = ContextManager::<TinyCapacities>::new();
    m.push_opening_task(Message::user("first request").at(1), "first").unwrap();
    m.push(Message::assistant("done").at(2)).unwrap();
    let tasks = m.tasks().to_vec();
    let (used, next, stats) = (m.used(), m.next_id(), m.stats());
    let huge = "word ".repeat(50_000);
    let refused = m.push_opening_task(Message::user(&huge).at(3), "too big");
    assert!(matches!(refused, Err(Error::MessageTooLarge { .. })), "{refused:?}");
    let orphan = m.push_opening_task(Message::tool_result("nope", "x").at(3), "orphan");
    assert_eq!(orphan, Err(Error::TaskInsideUnit));
    assert_eq!(m.tasks(), tasks.as_slice());
    assert_eq!((m.used(), m.next_id(), m.stats()), (used, next, stats));
}

#[test]
fn calls_still_waiting_are_closed_by_the_push_and_stay_in_the_task_before() {
    let mut m = Manager::with_config(Config::DEFAULT).unwrap();
    m.start_task("look around", 0).unwrap();
    let calls = [ToolCall::new("c1", "ls", "{}")];
    let head = m.push(Message::assistant("").with_tool_calls(&calls).at(1)).unwrap();
    // start_task would refuse here (a boundary between a call and its result); the push
    // closes the call first.
    assert!(matches!(m.start_task("x", 2), Err(Error::ToolCallsPending { .. })));
    let ask = m.push_opening_task(Message::user("Stop, do this instead").at(2), "instead").unwrap();
    assert_eq!(m.unanswered_calls(), 0);
    let before = m.tasks()[0];
    assert_eq!(before.first_id(), head);
    assert_eq!(before.last_id(), Some(ask - 1), "the synthetic result belongs to the task before");
    assert_eq!(m.current_task().map(|t| t.first_id()), Some(ask));
}
