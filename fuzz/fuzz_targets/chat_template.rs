//! Chat templates from hostile model files: the input, split at NUL bytes, is a
//! template and the contents of the messages (roles cycling system, user,
//! assistant). Compiling and rendering either fail with an error, or give a
//! string no longer than the output limit for those messages. A tenth of the
//! CLI's fuel takes this instrumented build about as long as the full limit
//! takes the release binary (under a second), and must keep every input
//! inside libFuzzer's timeout. Nothing panics.
#![no_main]

#[path = "../../cli/src/chat.rs"]
#[allow(dead_code)]
mod chat;

use libfuzzer_sys::fuzz_target;

use chat::{ChatTemplate, Message};

const ROLES: [&str; 3] = ["system", "user", "assistant"];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or_default();
    let messages: Vec<Message> = parts
        .enumerate()
        .map(|(i, c)| Message::new(ROLES[i % 3], c))
        .collect();
    let Ok(template) = ChatTemplate::with_fuel(source, chat::FUEL / 10) else {
        return;
    };
    let (bos, eos) = ("<s>", "</s>");
    let input: usize = messages
        .iter()
        .map(|m| m.role.len() + m.content.len())
        .sum::<usize>()
        + bos.len()
        + eos.len();
    let generation = data.len() % 2 == 1;
    match template.render(&messages, generation, bos, eos) {
        Ok(out) => assert!(
            out.len() <= chat::output_limit(input),
            "{} bytes",
            out.len()
        ),
        Err(e) => assert!(e.to_string().starts_with("the chat template"), "{e}"),
    }
});
