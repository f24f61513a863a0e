//! The pages' one stylesheet, inline in each page. Nothing may make a page wider than the
//! window: ids (up to 255 bytes), destinations and errors break anywhere, and a table too wide
//! still scrolls inside its own `div.scroll`.

/// Small and inline: the pages need nothing fetched after them.
pub const STYLE: &str = "
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#1b1f24;color:#fff;padding:.6em 1.2em;display:flex;gap:1.4em;align-items:center}
header a{color:#cfd6df;text-decoration:none}header a:hover{color:#fff}
header strong{margin-right:1em}header form{margin-left:auto}
main{padding:1em 1.6em;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff;margin:.6em 0 1.4em}
th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid #e3e6ea;vertical-align:top}
th{background:#eef0f3;font-weight:600}
form.inline{display:inline}
fieldset{border:1px solid #d8dce1;background:#fff;padding:.6em 1em;margin:.6em 0}
label{margin-right:1em}input,select{font:inherit;padding:.15em .3em}
button{font:inherit;padding:.2em .8em;cursor:pointer}
.handled,.dispatched{color:#1a7f37}.dead_letter,.dead_lettered,.failed{color:#cf222e}
.duplicate,.stale,.pending,.queued,.redriven{color:#9a6700}
.s-delivered{color:#1a7f37}.s-handled,.s-delivering{color:#0969da}.s-not_seen,.s-dead_letter_superseded,.s-discarded{color:#6e7781}
.s-delivery_failed,.s-dead_letter{color:#cf222e;font-weight:600}.s-delivery_failing{color:#bc4c00}
.s-stale,.s-queued,.s-redriven,.s-duplicate,.s-duplicate_only{color:#9a6700}
.error{color:#cf222e;font-weight:600}.banner{background:#dafbe1;border:1px solid #aceebb;padding:.5em .8em}
span.local{color:#6e7781}.muted{color:#6e7781}
ol#timeline{background:#fff;padding:.8em 2.4em;border:1px solid #e3e6ea}
ol#timeline li{margin:.3em 0}
pre{background:#fff;border:1px solid #e3e6ea;padding:.8em;overflow:auto;max-height:30em;white-space:pre-wrap}
h1,td,code,pre,li,p{overflow-wrap:anywhere}
div.scroll{overflow-x:auto;max-width:100%}td.destination{max-width:18em}
header{flex-wrap:wrap}
.cards{display:flex;gap:1em;flex-wrap:wrap}.card{background:#fff;border:1px solid #e3e6ea;padding:.6em 1em;min-width:10em}
.card b{display:block;font-size:1.5em}
";

#[cfg(test)]
mod tests {
    use super::STYLE;
    use crate::inspect::Story;

    #[test]
    fn every_story_has_its_colour() {
        for story in Story::ALL {
            let class = format!(".{}", story.class());
            let found = STYLE.match_indices(&class).any(|(at, _)| {
                // `.s-handled` is not `.s-handled_x`: the class name ends there.
                let next = STYLE[at + class.len()..].chars().next();
                matches!(next, Some('{' | ','))
            });
            assert!(found, "{class} has no colour");
        }
    }
}
