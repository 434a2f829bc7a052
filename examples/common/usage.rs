//! Bad usage: one line on stderr naming what was wrong and what is accepted, and exit code 2.

use clap::error::ErrorKind;

/// Parses the command line; on a bad flag prints one line and exits with code 2 (help and
/// version print as usual and exit 0). Installs the log subscriber first.
pub fn parse_flags<T: clap::Parser>() -> T {
    super::logging::install();
    T::try_parse().unwrap_or_else(|e| match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
        _ => {
            // clap's first line names the flag and carries our message; the rest is usage.
            let rendered = e.render().to_string();
            let line = rendered
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("error: bad flags");
            exit_usage(line.trim_start_matches("error: "))
        }
    })
}

/// Prints `error: {message}` as one line and exits with code 2 (bad usage).
pub fn exit_usage(message: &str) -> ! {
    eprintln!("error: {}", message.replace('\n', " "));
    std::process::exit(2)
}
