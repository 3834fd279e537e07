//! What each command's help shows after its options: notes and examples. They live in one
//! text file, `help.txt` (a `[command]` line, then its text), so that they read as they
//! print, and a test runs every example through the parser: none goes stale when an option
//! changes.

const HELP: &str = include_str!("help.txt");

/// `(command, text)` for each command of `help.txt`: the text `blazar <command> --help`
/// ends with.
pub fn after_help() -> impl Iterator<Item = (&'static str, &'static str)> {
    // Every section starts at a line `[name]`; the file starts with one.
    HELP.split("\n[").filter_map(|section| {
        let section = section.strip_prefix('[').unwrap_or(section);
        let (name, text) = section.split_once("]\n")?;
        Some((name, text.trim_end()))
    })
}

#[cfg(test)]
mod tests {
    use super::after_help;

    /// The example command lines of one text: the indented `blazar` lines under `Examples:`
    /// (not the prose after them), with `\` line continuations joined, split into words as a
    /// POSIX shell would.
    fn examples(text: &str) -> Vec<Vec<String>> {
        let Some((_, listed)) = text.split_once("Examples:\n") else {
            return Vec::new();
        };
        let joined = listed.replace("\\\n", " ");
        joined
            .lines()
            .filter(|line| line.starts_with("  blazar "))
            .map(|line| match shlex::split(line) {
                // What a shell does after the command's words (`&& echo done`, `> file`) is
                // not the command's.
                Some(words) => words
                    .into_iter()
                    .take_while(|w| {
                        !["&&", "||", ";", "|"].contains(&w.as_str()) && !w.starts_with(['>', '<'])
                    })
                    .collect(),
                None => panic!("unbalanced quotes in example {line:?}"),
            })
            .collect()
    }

    #[test]
    fn every_command_is_in_the_table_once() {
        let cli = super::super::command_line();
        let mut names: Vec<&str> = after_help().map(|(name, _)| name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a command is in help.txt twice");
        let mut commands: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        commands.sort_unstable();
        assert_eq!(names, commands);
    }

    /// An example that names an option a command no longer takes, or forgets a required
    /// argument, fails here rather than in a user's terminal.
    #[test]
    fn every_example_parses_as_the_command_it_documents() {
        let mut count = 0;
        let mut commands = 0;
        for (name, text) in after_help() {
            commands += 1;
            let lines = examples(text);
            assert!(!lines.is_empty(), "{name} has no example");
            for words in lines {
                assert_eq!(
                    words.first().map(String::as_str),
                    Some("blazar"),
                    "{words:?}"
                );
                let matches = match super::super::command_line().try_get_matches_from(&words) {
                    Ok(matches) => matches,
                    Err(e) => panic!("{words:?} does not parse: {e}"),
                };
                assert_eq!(matches.subcommand_name(), Some(name), "{words:?}");
                count += 1;
            }
        }
        assert!(commands > 0 && count >= commands);
    }
}
