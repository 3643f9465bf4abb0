// weightlift/text.h: text that came from outside (a server, a mirror, a file)
// made safe to show, and secrets kept out of what is shown.
//
// inert() is the one function through which every server- or file-chosen
// string (repository file names, ETags, URLs, headers, error bodies, tensor
// names, listed keys) reaches a message, a log line, a table or a Python
// exception. Status applies it to every message, file and tensor it carries
// (status.h), so an error is inert by construction; tables, logs and progress
// labels call it where they print. Python has the same function as
// weightlift._core.inert_text. (A ground-floor header: it depends on nothing.)
//
// Contract of inert(s):
//  * every control character is escaped visibly, so no byte that a terminal
//    acts on reaches it: C0 (0x00-0x1f, LF, CR and TAB included) and DEL as
//    \x1b-style escapes; C1 (U+0080-U+009F) and the Unicode format controls
//    that reorder or hide text (U+061C, U+200E-U+200F, U+2028-U+202E,
//    U+2066-U+2069) as \u009b-style escapes; each byte of invalid UTF-8 as \xNN;
//  * secrets in URLs are replaced by "***": the userinfo of scheme://user:pw@host,
//    and the values of query parameters that carry signatures, credentials or
//    tokens (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token,
//    X-Goog-Signature, X-Goog-Credential, Signature, sig, token, access_token,
//    AWSAccessKeyId, key, api_key: a name that is "sig", "key", "auth" or
//    "authorization", or holds "signature", "credential", "token", "secret",
//    "password", "passwd", "apikey", "api_key", "api-key", "accesskey" or
//    "access_key", in any case);
//  * idempotent (without a cut): inert(inert(s)) == inert(s). A backslash is kept as it is
//    (so already-rendered text is not rendered twice): the rendering is for
//    people, not a reversible encoding;
//  * printable text (ASCII and valid UTF-8 outside the ranges above) is
//    unchanged.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace wl {

// `s` escaped and redacted as above; cut to at most `max_bytes` bytes of
// that rendering (never inside a character or an escape), with "..." appended
// (the default keeps all of it). Secrets are redacted before the cut.
std::string inert(std::string_view s, size_t max_bytes = std::string_view::npos);

// Only the escaping of inert() (no redaction): for text that is known to hold
// no URL, such as a tensor name in a table.
std::string escape_controls(std::string_view s);

// Only the redaction of inert(): URL userinfo and secret query values.
std::string redact_secrets(std::string_view s);

// True when `s` holds a byte or character that escape_controls() escapes
// (C0, DEL, C1, the format controls above, invalid UTF-8). A name for which it
// is true is refused before it names anything on disk; a secret for which it
// is true is never sent (http.h's check_secret).
bool has_control_chars(std::string_view s);

}  // namespace wl
