//! The comments of the tree's sources, and the words that narrate history in them.
//!
//! A comment states a rule and its reason in the present tense. A reference to an issue by
//! its number (or to a numbered hole in one) points at a tracker this repository does not
//! carry, and a date says when something changed, which is history. Both belong in the
//! commit message or in `docs/decisions/`, never in a comment. The cases the matcher must
//! find and must pass are in its tests below, as string literals.
//!
//! Each language gets a small lexer that knows just enough of its strings to tell a comment
//! from code: a string literal is code (a test may well name an issue or a date in one),
//! and so is everything else that is not a comment or, in Python, a docstring.

use regex::Regex;
use std::path::Path;
use std::sync::LazyLock;

/// One line of a comment: its 1-based line number and its text (comment markers included).
pub type CommentLine = (usize, String);

/// The source languages whose comments are checked, by how a file is named.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Language {
    /// Rust, and C (the extension's C files): `//`, `/* */`.
    RustOrC,
    /// `#` comments and docstrings.
    Python,
    /// `#` comments; here-document bodies are data.
    Shell,
    /// `#` comments.
    Toml,
    /// A patch of the PostgreSQL series: its commit message and the C comments it adds.
    Patch,
}

/// The language of `path` (relative to the repository root), or `None` when its comments
/// are not checked.
pub fn language(rel: &Path) -> Option<Language> {
    let name = rel.file_name()?.to_str()?;
    let ext = rel.extension().and_then(|e| e.to_str()).unwrap_or("");
    let in_scripts = rel.starts_with("scripts") || rel.starts_with(".ci");
    match ext {
        "rs" | "c" | "h" => Some(Language::RustOrC),
        "py" => Some(Language::Python),
        "toml" => Some(Language::Toml),
        "sh" => Some(Language::Shell),
        "patch" => Some(Language::Patch),
        "" if in_scripts && !name.starts_with('.') => Some(Language::Shell),
        _ => None,
    }
}

/// The comment lines of `text` written in `lang`.
pub fn comments(lang: Language, text: &str) -> Vec<CommentLine> {
    match lang {
        Language::RustOrC => c_like(text),
        Language::Python => hash_comments(text, HashLang::Python),
        Language::Shell => hash_comments(text, HashLang::Shell),
        Language::Toml => hash_comments(text, HashLang::Toml),
        Language::Patch => patch(text),
    }
}

/// Collects the characters of comments, line by line.
struct Collector {
    out: Vec<CommentLine>,
    line: usize,
    current: Option<String>,
}

impl Collector {
    fn new() -> Self {
        Collector { out: Vec::new(), line: 1, current: None }
    }

    fn push(&mut self, c: char) {
        if c == '\n' {
            self.newline();
        } else {
            self.current.get_or_insert_with(String::new).push(c);
        }
    }

    /// A character that is not part of a comment.
    fn code(&mut self, c: char) {
        if c == '\n' {
            self.newline();
        }
    }

    fn newline(&mut self) {
        if let Some(text) = self.current.take() {
            self.out.push((self.line, text));
        }
        self.line += 1;
    }

    fn finish(mut self) -> Vec<CommentLine> {
        self.newline();
        self.out
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Rust and C: line comments, block comments (nested, as Rust's are), and the literals
/// that may contain comment markers: strings (with escapes), raw strings (`r#"..."#`),
/// character literals (told from lifetimes by their closing quote).
fn c_like(text: &str) -> Vec<CommentLine> {
    let s: Vec<char> = text.chars().collect();
    let mut c = Collector::new();
    let mut i = 0;
    while i < s.len() {
        let at = |k: usize| s.get(k).copied();
        match s[i] {
            '/' if at(i + 1) == Some('/') => {
                while i < s.len() && s[i] != '\n' {
                    c.push(s[i]);
                    i += 1;
                }
            }
            '/' if at(i + 1) == Some('*') => {
                let mut depth = 0;
                while i < s.len() {
                    if s[i] == '/' && at(i + 1) == Some('*') {
                        depth += 1;
                        c.push('/');
                        c.push('*');
                        i += 2;
                    } else if s[i] == '*' && at(i + 1) == Some('/') {
                        depth -= 1;
                        c.push('*');
                        c.push('/');
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        c.push(s[i]);
                        i += 1;
                    }
                }
            }
            '"' => {
                c.code('"');
                i += 1;
                while i < s.len() && s[i] != '"' {
                    if s[i] == '\\' {
                        c.code(s[i]);
                        i += 1;
                    }
                    if i < s.len() {
                        c.code(s[i]);
                        i += 1;
                    }
                }
                i += 1;
            }
            'r' | 'b' if i == 0 || !is_ident(s[i - 1]) => {
                // A raw string: r"..", r#".."#, br"..".
                let mut j = i + if s[i] == 'b' && at(i + 1) == Some('r') { 2 } else { 1 };
                if s[i] == 'b' && j == i + 1 {
                    // b"..." and b'.' are ordinary literals: let the next turn take them.
                    c.code(s[i]);
                    i += 1;
                    continue;
                }
                let hashes = s[j..].iter().take_while(|&&h| h == '#').count();
                j += hashes;
                if at(j) != Some('"') {
                    c.code(s[i]);
                    i += 1;
                    continue;
                }
                i = j + 1;
                while i < s.len() {
                    if s[i] == '"' && s[i + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes {
                        i += 1 + hashes;
                        break;
                    }
                    c.code(s[i]);
                    i += 1;
                }
            }
            '\'' => {
                if at(i + 1) == Some('\\') {
                    // An escaped character literal: '\n', '\'', '\u{..}'.
                    i += 3;
                    while i < s.len() && s[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if at(i + 2) == Some('\'') {
                    i += 3;
                } else {
                    // A lifetime or a label.
                    i += 1;
                }
            }
            ch => {
                c.code(ch);
                i += 1;
            }
        }
    }
    c.finish()
}

#[derive(Clone, Copy, PartialEq)]
enum HashLang {
    Python,
    Shell,
    Toml,
}

/// Python, shell and TOML: `#` comments outside string literals, and Python's docstrings
/// (a string standing alone on its line where a statement begins, after a line ending in
/// `:` or at the top of the file). In shell, `#` starts a comment only at the start of a
/// word, and here-document bodies are skipped.
fn hash_comments(text: &str, lang: HashLang) -> Vec<CommentLine> {
    let s: Vec<char> = text.chars().collect();
    let mut c = Collector::new();
    // The last character of code before `i` that is not white space (Python's docstrings).
    let mut last_code: Option<char> = None;
    // Here-document terminators waiting for the end of the current line (shell).
    let mut heredocs: Vec<(String, bool)> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let at = |k: usize| s.get(k).copied();
        let ch = s[i];
        let word_start = i == 0 || s[i - 1].is_whitespace() || matches!(s[i - 1], ';' | '(' | '|' | '&');
        match ch {
            '#' if lang != HashLang::Shell || word_start => {
                while i < s.len() && s[i] != '\n' {
                    c.push(s[i]);
                    i += 1;
                }
            }
            '\\' if lang != HashLang::Toml => {
                c.code(ch);
                if let Some(n) = at(i + 1) {
                    c.code(n);
                }
                i += 2;
            }
            '\'' | '"' => {
                let triple = lang != HashLang::Shell && at(i + 1) == Some(ch) && at(i + 2) == Some(ch);
                let line_start = s[..i].iter().rposition(|&x| x == '\n').map_or(0, |p| p + 1);
                let alone = s[line_start..i].iter().all(|x| x.is_whitespace() || x.is_ascii_alphabetic());
                let docstring = lang == HashLang::Python && triple && alone && matches!(last_code, None | Some(':'));
                let escapes = ch == '"' || lang == HashLang::Python;
                let quote_len = if triple { 3 } else { 1 };
                let mut text = String::new();
                i += quote_len;
                loop {
                    if i >= s.len() {
                        break;
                    }
                    if s[i] == ch && (!triple || (at(i + 1) == Some(ch) && at(i + 2) == Some(ch))) {
                        i += quote_len;
                        break;
                    }
                    if !triple && lang != HashLang::Shell && s[i] == '\n' {
                        break;
                    }
                    if escapes && s[i] == '\\' && i + 1 < s.len() {
                        text.push(s[i]);
                        text.push(s[i + 1]);
                        i += 2;
                        continue;
                    }
                    text.push(s[i]);
                    i += 1;
                }
                for t in text.chars() {
                    if docstring {
                        c.push(t);
                    } else {
                        c.code(t);
                    }
                }
                last_code = Some(ch);
            }
            '<' if lang == HashLang::Shell && at(i + 1) == Some('<') && at(i + 2) != Some('<') => {
                // A here-document: `<<WORD`, `<<-WORD`, `<<'WORD'`, `<<"WORD"`.
                let mut j = i + 2;
                let strip_tabs = at(j) == Some('-');
                if strip_tabs {
                    j += 1;
                }
                while at(j) == Some(' ') {
                    j += 1;
                }
                let word: String = s[j..].iter().take_while(|x| is_ident(**x) || matches!(x, '\'' | '"')).collect();
                let word = word.trim_matches(|x| x == '\'' || x == '"').to_string();
                // A word, not a number: `$((1 << 3))` is arithmetic.
                if word.starts_with(|x: char| x.is_alphabetic() || x == '_') {
                    heredocs.push((word, strip_tabs));
                }
                i += 2;
            }
            '\n' => {
                c.code('\n');
                i += 1;
                for (word, strip_tabs) in std::mem::take(&mut heredocs) {
                    while i < s.len() {
                        let end = s[i..].iter().position(|&x| x == '\n').map_or(s.len(), |p| i + p);
                        let line: String = s[i..end].iter().collect();
                        i = (end + 1).min(s.len());
                        c.code('\n');
                        let line = if strip_tabs { line.trim_start_matches('\t') } else { &line };
                        if line == word {
                            break;
                        }
                    }
                }
            }
            _ => {
                c.code(ch);
                if !ch.is_whitespace() {
                    last_code = Some(ch);
                }
                i += 1;
            }
        }
    }
    c.finish()
}

/// A patch of the series: its commit message (everything before the first `diff`), and the
/// comment part of each line it adds (from `/*` or `//` on, or the whole line where it
/// continues a block comment with `*`). Context and removed lines are PostgreSQL's own.
fn patch(text: &str) -> Vec<CommentLine> {
    let mut out = Vec::new();
    let mut in_message = true;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("diff ") {
            in_message = false;
        }
        if in_message {
            out.push((i + 1, line.to_string()));
            continue;
        }
        let Some(added) = line.strip_prefix('+').filter(|_| !line.starts_with("+++")) else { continue };
        let from = [added.find("/*"), added.find("//")].into_iter().flatten().min();
        if let Some(from) = from {
            out.push((i + 1, added[from..].to_string()));
        } else if added.trim_start().starts_with('*') {
            out.push((i + 1, added.to_string()));
        }
    }
    out
}

static ISSUE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?i)\bissues?\s+(#)?\d+(?:'s)?(?:\s+(\w+))?").expect("a valid pattern"));
static HOLE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?i)\bholes?\s+\d+\b").expect("a valid pattern"));
static TICKET: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?:^|[\s(\[])(#\d+)\b").expect("a valid pattern"));
static DATE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b").expect("a valid pattern"));

/// Dates that name an epoch, a fact of a format rather than a moment of this project.
const EPOCHS: &[&str] = &["1970-01-01", "2000-01-01"];

/// What in `text` narrates history: "issue" or "hole" with a number, a `#12`-style
/// reference, a date. The verb passes: "issue" with a number followed by a word
/// other than "and", "or" or "hole" counts what is issued, not which issue.
pub fn narration(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for m in ISSUE.captures_iter(text) {
        let next = m.get(2).map(|w| w.as_str().to_lowercase());
        let reference = m.get(1).is_some() || next.as_deref().is_none_or(|w| ["and", "or", "hole", "holes"].contains(&w));
        if reference {
            found.push(m.get(0).expect("the match").as_str().to_string());
        }
    }
    found.extend(HOLE.find_iter(text).map(|m| m.as_str().to_string()));
    found.extend(TICKET.captures_iter(text).map(|m| m[1].to_string()));
    found.extend(DATE.find_iter(text).map(|m| m.as_str().to_string()).filter(|d| !EPOCHS.contains(&d.as_str())));
    found
}

/// Every `(line, what, text)` of `comments` that narrates history. A comment line is read
/// together with the next one when that one follows it directly, so that "issue" at the
/// end of a line and "14" at the start of the next are found; a hit is reported on the line
/// where it starts.
pub fn narrating(comments: &[CommentLine]) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (k, (line, text)) in comments.iter().enumerate() {
        let next = comments.get(k + 1).filter(|(l, _)| *l == line + 1).map(|(_, t)| strip_marker(t)).unwrap_or("");
        let joined = format!("{text} {next}");
        let own = narration(text);
        let both = narration(&joined);
        // What starts on this line: found in it alone, or found only across the break with
        // its start on this line.
        let mut hits = own.clone();
        for hit in both {
            if !own.contains(&hit) && !narration(next).contains(&hit) && !hits.contains(&hit) {
                hits.push(hit);
            }
        }
        for hit in hits {
            out.push((*line, hit, text.trim().to_string()));
        }
    }
    out
}

/// A comment line without its leading marker (`//`, `///`, `//!`, `#`, `*`).
fn strip_marker(text: &str) -> &str {
    text.trim_start().trim_start_matches(['/', '!', '#', '*']).trim_start()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(lang: Language, src: &str) -> Vec<String> {
        comments(lang, src).into_iter().map(|(l, t)| format!("{l}:{t}")).collect()
    }

    #[test]
    fn rust_comments_are_found_and_literals_are_not() {
        let src = "// a\nlet s = \"// not\"; /* b\n c */ let r = r#\"/* \"no\" */\"#;\nlet c = '\"'; fn f<'a>() {} // d\n";
        assert_eq!(texts(Language::RustOrC, src), ["1:// a", "2:/* b", "3: c */", "4:// d"]);
    }

    #[test]
    fn python_comments_and_docstrings_are_found_and_strings_are_not() {
        let src = "\"\"\"Module.\n\nissue 3\"\"\"\nx = \"# no\"  # yes\ndef f(\n    a,\n):\n    \"\"\"Doc.\"\"\"\n    q = \"\"\"\n    issue 4\"\"\"\n";
        assert_eq!(texts(Language::Python, src), ["1:Module.", "3:issue 3", "4:# yes", "8:Doc."]);
    }

    #[test]
    fn shell_comments_skip_quotes_parameters_and_here_documents() {
        let src = "# a\necho \"# no\" '# no' ${#x} $# # b\ncat <<EOF\n# data\nEOF\n# c\n";
        assert_eq!(texts(Language::Shell, src), ["1:# a", "2:# b", "6:# c"]);
    }

    #[test]
    fn the_matcher_finds_issue_numbers_and_dates_and_passes_the_verb() {
        for hit in [
            "see issue 12",
            "(issue #12)",
            "issues 3 and 4",
            "issue 14, hole 8",
            "the issue's hole 3",
            "Found by the simulation (seed 408,152, issue 14)",
            "issue 14's hole 3",
            "measured (2026-11-25)",
            "fixed in #31",
        ] {
            assert!(!narration(hit).is_empty(), "{hit:?} should be found");
        }
        for pass in [
            "we issue a request",
            "backends issue 3 requests at once",
            "seed 408,152 reproduces it",
            "microseconds since 2000-01-01",
            "`#[cfg(test)]`",
            "the issue at hand",
        ] {
            assert!(narration(pass).is_empty(), "{pass:?} should pass: {:?}", narration(pass));
        }
    }

    #[test]
    fn a_reference_broken_across_lines_is_found_on_its_first_line() {
        let c = vec![(1, "// as in issue".to_string()), (2, "// 14, a rule".to_string())];
        let hits = narrating(&c);
        assert_eq!(hits.len(), 1, "{hits:?}");
        assert_eq!(hits[0].0, 1);
    }
}
