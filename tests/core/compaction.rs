//! Compaction as a transition of `Conversation<AwaitingModel>`: over
//! arbitrary conversations compacted at arbitrary points with each
//! built-in compactor, every request sent afterwards keeps the protocol
//! (each call answered in the next message, no orphan result, user first
//! and last), the question stays first, and the conversation goes on; a
//! compactor that proposes a broken history is refused and changes nothing.

use crate::common::keeps_the_protocol;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use serde_json::json;
use subloop::core::compaction::{ClearToolResults, Compactor, SlidingWindow};
use subloop::core::conversation::Compacted;
use subloop::core::conversation::{AfterTools, AwaitingModel, Reply, ToolOutput};
use subloop::core::protocol::{Block, Message, Role, ToolResultContent};
use subloop::{Budget, Conversation, ModelResponse};

const QUESTION: &str = "What does main.py print?";

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/compaction.txt",
        ))),
        ..ProptestConfig::default()
    }
}

/// One step of a generated conversation: a reply with `calls` calls (0: an
/// answer, then a follow-up question), results of `size` characters, and
/// whether to compact before the next request, with which compactor.
#[derive(Debug, Clone)]
struct Step {
    calls: usize,
    size: usize,
    compact: Option<(bool, usize)>,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0usize..4,
        0usize..200,
        proptest::option::of((any::<bool>(), 0usize..4)),
    )
        .prop_map(|(calls, size, compact)| Step {
            calls,
            size,
            compact,
        })
}

fn compactor(sliding: bool, keep: usize) -> Box<dyn Compactor> {
    if sliding {
        Box::new(SlidingWindow::new(keep))
    } else {
        Box::new(ClearToolResults::new(keep))
    }
}

/// Drives `steps`, compacting where a step says so; checks every history a
/// request would carry. Returns how many compactions shortened the history.
fn drive(steps: &[Step]) -> Result<usize, TestCaseError> {
    let budget = Budget::new(u32::try_from(steps.len() + 1).unwrap()).unwrap();
    let mut conversation: Conversation<AwaitingModel> =
        Conversation::start(QUESTION, budget).unwrap();
    let mut shortened = 0;
    let mut round = 0;
    let mut current = QUESTION.to_owned();
    for step in steps {
        if let Some((sliding, keep)) = step.compact {
            let before = conversation.history().to_vec();
            conversation = match conversation.compact(&*compactor(sliding, keep)) {
                Compacted::Shortened(next) => {
                    shortened += 1;
                    next
                }
                Compacted::Unchanged(next) => {
                    prop_assert_eq!(next.history(), &before[..]);
                    next
                }
                Compacted::Refused { reason, .. } => {
                    return Err(TestCaseError::fail(format!(
                        "a built-in was refused: {reason}"
                    )));
                }
                _ => unreachable!(),
            };
            // The question stays first, and the current question stays.
            let first = conversation.history().first().unwrap();
            prop_assert!(first.text().starts_with(QUESTION), "{first:?}");
            prop_assert!(
                conversation
                    .history()
                    .iter()
                    .any(|m| m.role == Role::User && m.text().starts_with(&current)),
                "the current question {current:?} was lost"
            );
        }
        let history = conversation.history();
        keeps_the_protocol(history).map_err(TestCaseError::fail)?;
        round += 1;
        let reply = if step.calls == 0 {
            ModelResponse::answer(format!("answer {round}"))
        } else {
            ModelResponse::tool_calls((0..step.calls).map(|i| {
                (
                    format!("toolu_{round}_{i}"),
                    "read_file",
                    json!({"path": "a"}),
                )
            }))
        };
        conversation = match conversation.receive(reply) {
            Reply::Tools(pending) => {
                let text = "x".repeat(step.size);
                match pending.answer_with(|_| ToolOutput::ok(text.clone())) {
                    AfterTools::Continue(next) => next,
                    _ => return Ok(shortened),
                }
            }
            Reply::Answered(finished) => {
                current = format!("And then? ({round})");
                match finished.follow_up(&current, budget) {
                    Ok(next) => next,
                    Err(_) => return Ok(shortened),
                }
            }
            _ => return Ok(shortened),
        };
    }
    keeps_the_protocol(conversation.history()).map_err(TestCaseError::fail)?;
    Ok(shortened)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn compacted_histories_keep_the_protocol_and_the_question(
        steps in prop::collection::vec(step(), 1..24)
    ) {
        drive(&steps)?;
    }
}

/// The property's driver does compact: on a long enough run, both
/// built-ins shorten the history (so the property is not checked on
/// untouched histories only).
#[test]
fn the_drive_of_the_property_compacts_with_both_built_ins() {
    let steps: Vec<Step> = (0..10)
        .map(|i| Step {
            calls: 2,
            size: 50,
            compact: (i >= 4).then_some((i % 2 == 0, 1)),
        })
        .collect();
    let shortened = drive(&steps).unwrap();
    assert!(shortened >= 4, "{shortened}");
}

/// A conversation after `rounds` rounds of one call each, results of
/// `size` characters.
fn after_rounds(rounds: usize, size: usize) -> Conversation<AwaitingModel> {
    let mut conversation = Conversation::start(QUESTION, Budget::new(64).unwrap()).unwrap();
    for round in 0..rounds {
        let name = if round == 0 { "task" } else { "read_file" };
        let reply = ModelResponse::tool_calls([(format!("t{round}"), name, json!({}))]);
        let Reply::Tools(pending) = conversation.receive(reply) else {
            unreachable!()
        };
        let AfterTools::Continue(next) = pending.answer_with(|_| ToolOutput::ok("y".repeat(size)))
        else {
            unreachable!()
        };
        conversation = next;
    }
    conversation
}

fn result_texts(history: &[Message]) -> Vec<String> {
    history
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|block| match block {
            Block::ToolResult {
                content: ToolResultContent::Text(text),
                ..
            } => Some(text.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn clearing_keeps_the_last_results_and_the_childrens_reports() {
    let conversation = after_rounds(5, 100);
    let Compacted::Shortened(next) = conversation.compact(&ClearToolResults::new(2)) else {
        panic!("nothing cleared")
    };
    let texts = result_texts(next.history());
    assert_eq!(texts.len(), 5);
    // The `task` report (round 0) stays whole; rounds 1 and 2 are cleared;
    // the last two stay.
    assert_eq!(texts[0], "y".repeat(100));
    for cleared in &texts[1..3] {
        assert_eq!(
            cleared,
            "[cleared to fit the context window: the result of read_file (100 characters) was removed]"
        );
    }
    assert_eq!(texts[3], "y".repeat(100));
    assert_eq!(texts[4], "y".repeat(100));
    assert_eq!(next.calls_made(), 5);
    // Clearing again finds nothing more to clear.
    assert!(matches!(
        next.compact(&ClearToolResults::new(2)),
        Compacted::Unchanged(_)
    ));
}

#[test]
fn the_sliding_window_drops_whole_rounds_and_counts_them_on_the_question() {
    let conversation = after_rounds(6, 10);
    let Compacted::Shortened(next) = conversation.compact(&SlidingWindow::new(2)) else {
        panic!("nothing dropped")
    };
    // The question, then two rounds (a reply and its results each).
    assert_eq!(next.history().len(), 5);
    assert_eq!(
        next.history()[0].text(),
        format!("{QUESTION}\n[4 {}", SlidingWindow::NOTE)
    );
    keeps_the_protocol(next.history()).unwrap();
    // A second window adds to the count.
    let next = after_more(next, 3);
    let Compacted::Shortened(next) = next.compact(&SlidingWindow::new(1)) else {
        panic!("nothing dropped")
    };
    assert_eq!(
        next.history()[0].text(),
        format!("{QUESTION}\n[8 {}", SlidingWindow::NOTE)
    );
    assert_eq!(next.history().len(), 3);
}

fn after_more(
    mut conversation: Conversation<AwaitingModel>,
    rounds: usize,
) -> Conversation<AwaitingModel> {
    for round in 0..rounds {
        let reply = ModelResponse::tool_calls([(format!("more{round}"), "read_file", json!({}))]);
        let Reply::Tools(pending) = conversation.receive(reply) else {
            unreachable!()
        };
        let AfterTools::Continue(next) = pending.answer_with(|_| ToolOutput::ok("z")) else {
            unreachable!()
        };
        conversation = next;
    }
    conversation
}

/// What a broken compactor does to a history.
type Breaks = fn(&[Message]) -> Vec<Message>;

/// A compactor that proposes what it is told to.
struct Broken(Breaks);

impl Compactor for Broken {
    fn name(&self) -> &str {
        "broken"
    }

    fn compact(&self, history: &[Message]) -> Option<Vec<Message>> {
        Some((self.0)(history))
    }
}

#[test]
fn a_history_that_breaks_the_protocol_or_loses_the_question_is_refused() {
    let cases: [(&str, Breaks); 8] = [
        // The last results replaced by a text: a call without its result.
        ("no result right after it", |h| {
            let mut h = h.to_vec();
            let last = h.len() - 1;
            h[last] = Message::user_text("the results are gone");
            h
        }),
        // The last results dropped: the history ends with a reply.
        ("does not end with a user message", |h| {
            h[..h.len() - 1].to_vec()
        }),
        // A reply dropped, its results kept: an orphan result.
        ("answers no call", |h| {
            let mut h = h.to_vec();
            h.remove(1);
            h
        }),
        // The question replaced.
        ("the question is not kept", |h| {
            let mut h = h.to_vec();
            h[0] = Message::user_text("something else");
            h
        }),
        ("the history is empty", |_| Vec::new()),
        // A result given twice.
        ("appears twice", |h| {
            let mut h = h.to_vec();
            let last = h.len() - 1;
            let again = h[last].content[0].clone();
            h[last].content.push(again);
            h
        }),
        // Text before the results.
        ("after other content", |h| {
            let mut h = h.to_vec();
            let last = h.len() - 1;
            h[last].content.insert(
                0,
                Block::Text {
                    text: "first".into(),
                },
            );
            h
        }),
        // A message emptied.
        ("has no content", |h| {
            let mut h = h.to_vec();
            h[0].content.clear();
            h
        }),
    ];
    for (expected, breaks) in cases {
        let conversation = after_rounds(3, 5);
        let before = conversation.history().to_vec();
        match conversation.compact(&Broken(breaks)) {
            Compacted::Refused {
                conversation,
                reason,
            } => {
                assert!(reason.contains(expected), "{expected}: {reason}");
                assert_eq!(conversation.history(), &before[..]);
            }
            other => panic!("{expected}: not refused: {other:?}"),
        }
    }
}

#[test]
fn the_sliding_window_keeps_a_follow_up_question() {
    // Q1, A1 (answer), Q2, then rounds of calls: the window may not drop
    // the round that holds Q2.
    let conversation = Conversation::start(QUESTION, Budget::new(64).unwrap()).unwrap();
    let Reply::Answered(finished) = conversation.receive(ModelResponse::answer("first")) else {
        unreachable!()
    };
    let next = finished
        .follow_up("And what does it print now?", Budget::new(64).unwrap())
        .unwrap();
    let next = after_more(next, 4);
    let Compacted::Unchanged(next) = next.compact(&SlidingWindow::new(1)) else {
        panic!("the round holding the follow-up was dropped")
    };
    assert!(
        next.history()
            .iter()
            .any(|m| m.text() == "And what does it print now?")
    );
}

#[test]
fn a_question_that_looks_like_a_note_is_not_taken_for_one() {
    let question = format!("[18446744073709551615 {}", SlidingWindow::NOTE);
    let conversation = Conversation::start(&question, Budget::new(64).unwrap()).unwrap();
    let conversation = after_more(conversation, 4);
    let Compacted::Shortened(next) = conversation.compact(&SlidingWindow::new(1)) else {
        panic!("not shortened")
    };
    // The question's own text stays, and the note follows it.
    assert_eq!(
        next.history()[0].text(),
        format!("{question}\n[3 {}", SlidingWindow::NOTE)
    );
}
