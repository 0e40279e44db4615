//! A run's graph as SVG: nodes in layers by their longest path from a root
//! (so every edge points right), coloured by their task's state; and what
//! the graph shows of each task of a run (its state, a note, a link).

use std::collections::{HashMap, HashSet};

use composer_core::definition::{Edge, EdgeOn, Workflow};
use composer_core::machine::TaskState;
use composer_store::limits::Held;
use composer_store::runs::{RunRow, TaskRow};
use uuid::Uuid;

use super::html::{html, state_class, Html};

const W: usize = 200;
const H: usize = 46;
/// A label's distance from its box's left (and right) side.
const INSET: usize = 10;
const GAP_X: usize = 60;
const GAP_Y: usize = 18;
const PAD: usize = 10;

/// What the graph shows of one node's task.
#[derive(Debug, Clone, Default)]
pub struct NodeState {
    pub state: String,
    /// A second line: a MAP's counts, an attempt number.
    pub note: Option<String>,
    /// Where clicking the node goes (a child run).
    pub link: Option<String>,
}

/// What the graph shows of each task of a run, by node id: `held` says
/// which limit holds a task, `child_of` the child run a task started.
pub fn node_states(
    wf: &Workflow,
    tasks: &[TaskRow],
    held: &HashMap<Uuid, Held>,
    child_of: &HashMap<Uuid, &RunRow>,
) -> HashMap<String, NodeState> {
    let mut states = HashMap::new();
    for t in tasks {
        let mut state = NodeState { state: t.state.as_str().to_string(), ..Default::default() };
        let node = wf.node_index(&t.node_id).map(|n| &wf.nodes[n].kind);
        if let Some(h) = held.get(&t.id) {
            state.note = Some(format!("held: {} ({})", h.key, h.reason));
        } else if let Some(p) = t.map_progress() {
            state.note = Some(format!("{}/{} done", p.completed + p.failed, p.total));
        } else if node.is_some_and(|k| k.traits().has_child) {
            state.link = child_of.get(&t.id).map(|c| format!("/ui/runs/{}", c.id));
            state.note = t.iteration.map(|i| format!("iteration {}", i + 1));
        } else if t.attempt > 1 {
            state.note = Some(format!("attempt {}", t.attempt));
        }
        states.insert(t.node_id.clone(), state);
    }
    states
}

/// Whether some task waits for a limit (only then is it worth asking
/// which limits hold them).
pub fn any_held(tasks: &[TaskRow]) -> bool {
    tasks.iter().any(|t| t.state == TaskState::Pending && t.limit_keys.is_some())
}

/// The column of each node: 0 for roots, else one more than its furthest
/// predecessor.
pub fn layers(wf: &Workflow) -> Vec<usize> {
    let mut layer = vec![0; wf.nodes.len()];
    for &n in &wf.topo_order {
        for &e in &wf.outgoing[n] {
            let to = wf.edges[e].to;
            layer[to] = layer[to].max(layer[n] + 1);
        }
    }
    layer
}

/// Where each node of the graph is drawn: the nodes drawn (not a MAP's
/// item template), and each one's column and row.
struct Layout {
    drawn: Vec<usize>,
    layer: Vec<usize>,
    row: Vec<usize>,
    width: usize,
    height: usize,
}

impl Layout {
    fn of(wf: &Workflow) -> Layout {
        let layer = layers(wf);
        let drawn: Vec<usize> = (0..wf.nodes.len()).filter(|&n| wf.nodes[n].item_of.is_none()).collect();
        let mut row = vec![0; wf.nodes.len()];
        let mut per_layer: HashMap<usize, usize> = HashMap::new();
        for &n in &drawn {
            let r = per_layer.entry(layer[n]).or_default();
            row[n] = *r;
            *r += 1;
        }
        let columns = drawn.iter().map(|&n| layer[n] + 1).max().unwrap_or(1);
        let rows = per_layer.values().copied().max().unwrap_or(1);
        let width = PAD * 2 + columns * W + (columns - 1) * GAP_X;
        let height = PAD * 2 + rows * H + (rows - 1) * GAP_Y;
        Layout { drawn, layer, row, width, height }
    }

    /// The top left corner of node `n`.
    fn at(&self, n: usize) -> (usize, usize) {
        (PAD + self.layer[n] * (W + GAP_X), PAD + self.row[n] * (H + GAP_Y))
    }
}

/// The SVG of `wf`, each node coloured by `states` (by node id; a node
/// without one was not reached), the edges the run took (`taken`, `(from,
/// to)` node ids) drawn bold; failure and always edges have their own look.
pub fn svg(wf: &Workflow, states: &HashMap<String, NodeState>, taken: &HashSet<(String, String)>) -> Html {
    let layout = Layout::of(wf);
    let edges: Html = wf.edges.iter().map(|e| edge(wf, &layout, e, taken)).collect();
    let nodes: Html = layout.drawn.iter().map(|&n| node(wf, &layout, n, states.get(&wf.nodes[n].id))).collect();
    html!(
        "<svg class=\"dag\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" width=\"{}\" \
         height=\"{}\" role=\"img\" aria-label=\"the run's graph\"><defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" \
         refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">\
         <path d=\"M 0 0 L 10 5 L 0 10 z\"/></marker></defs>{}{}</svg>",
        layout.width,
        layout.height,
        layout.width,
        layout.height,
        edges,
        nodes
    )
}

/// An edge: a curve from its source's right side to its target's left, its
/// condition in its title.
fn edge(wf: &Workflow, layout: &Layout, e: &Edge, taken: &HashSet<(String, String)>) -> Html {
    let ((x1, y1), (x2, y2)) = (layout.at(e.from), layout.at(e.to));
    let (sx, sy, tx, ty) = (x1 + W, y1 + H / 2, x2, y2 + H / 2);
    let mid = (sx + tx) / 2;
    let mut class = String::from("edge");
    if e.when.is_some() {
        class.push_str(" when");
    }
    if e.on != EdgeOn::Success {
        class.push(' ');
        class.push_str(e.on.as_str());
    }
    if taken.contains(&(wf.nodes[e.from].id.clone(), wf.nodes[e.to].id.clone())) {
        class.push_str(" taken");
    }
    let on = match e.on {
        EdgeOn::Success => None,
        other => Some(format!("on {}", other.as_str())),
    };
    let when = e.when.as_ref().map(|w| format!("when {}", w.source()));
    let title = match (on, when) {
        (None, None) => None,
        (Some(on), Some(when)) => Some(html!("<title>{} · {}</title>", on, when)),
        (on, when) => Some(html!("<title>{}{}</title>", on, when)),
    };
    html!(
        "<path class=\"{}\" d=\"M {} {} C {} {}, {} {}, {} {}\" marker-end=\"url(#arrow)\">{}</path>",
        class,
        sx,
        sy,
        mid,
        sy,
        mid,
        ty,
        tx,
        ty,
        title
    )
}

/// A node: a box with its id, its note (or type) and state, a link when
/// it has one.
fn node(wf: &Workflow, layout: &Layout, n: usize, s: Option<&NodeState>) -> Html {
    let node = &wf.nodes[n];
    let (x, y) = layout.at(n);
    let state = s.map(|s| s.state.as_str()).unwrap_or("NOT REACHED");
    let note = s.and_then(|s| s.note.clone()).unwrap_or_else(|| node.node_type.clone());
    // The state whole, the note in what is left: the title has them all.
    let room = (W - 2 * INSET) as f64;
    let state_part = format!(" · {state}");
    let sub = SUB_FONT.fit(&note, room - SUB_FONT.width(&state_part)) + &state_part;
    let body = html!(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"6\"/>\
         <text x=\"{}\" y=\"{}\" class=\"id\">{}</text><text x=\"{}\" y=\"{}\" class=\"sub\">{}</text>\
         <title>{} ({}): {}</title>",
        x,
        y,
        W,
        H,
        x + INSET,
        y + 19,
        ID_FONT.fit(&node.id, room),
        x + INSET,
        y + 36,
        sub,
        node.id,
        node.node_type,
        state
    );
    let drawn = html!("<g class=\"node {}\" data-node=\"{}\">{}</g>", state_class(state), node.id, body);
    match s.and_then(|s| s.link.as_deref()) {
        Some(link) => html!("<a href=\"{}\">{}</a>", link, drawn),
        None => drawn,
    }
}

/// The font of a line of a node's box (`app.css`: `text.id`, `text.sub`).
#[derive(Clone, Copy)]
struct Font {
    px: f64,
    bold: bool,
}

const ID_FONT: Font = Font { px: 13.0, bold: true };
const SUB_FONT: Font = Font { px: 11.0, bold: false };

impl Font {
    /// `text` as it fits in `room` pixels: whole, or cut with `…`.
    fn fit(self, text: &str, room: f64) -> String {
        if self.width(text) <= room {
            return text.to_string();
        }
        let mut used = self.width("…");
        let mut out: String = text
            .chars()
            .take_while(|c| {
                used += self.char_width(*c);
                used <= room
            })
            .collect();
        out.push('…');
        out
    }

    /// How wide `text` is drawn, at most.
    fn width(self, text: &str) -> f64 {
        text.chars().map(|c| self.char_width(c)).sum()
    }

    /// A character's width: its ems, rounded up from DejaVu Sans (what
    /// `system-ui` is on a Linux without other fonts, and wider than the
    /// usual fonts elsewhere), so a label measured so fits in any of them.
    /// Past ASCII, as wide as the widest letters (Cyrillic, CJK, emoji).
    fn char_width(self, c: char) -> f64 {
        let (bold, regular) = match c {
            'i' | 'j' | 'l' | '\'' | ' ' | '·' => (0.35, 0.32),
            'I' | 'J' | '/' | '\\' | '|' | '.' | ',' | ':' | ';' | 'f' => (0.41, 0.35),
            '-' | '!' | '(' | ')' | '[' | ']' | 't' | 'r' | '"' | '*' | '_' | '`' => (0.53, 0.5),
            '?' | 'z' | 'c' | 's' => (0.6, 0.55),
            'W' | 'M' | 'm' | '%' | '@' => (1.11, 1.0),
            'w' | '&' | '…' => (1.0, 1.0),
            'A'..='Z' => (0.85, 0.79),
            '#' | '+' | '<' | '=' | '>' | '^' | '~' => (0.85, 0.84),
            c if c.is_ascii() => (0.72, 0.64),
            _ => (1.25, 1.1),
        };
        self.px * if self.bold { bold } else { regular }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_graph_shows_every_node_coloured_by_state_and_no_item_template() {
        let http = |id: &str| json!({"id": id, "type": "HTTP", "config": {"url": "http://h/x"}});
        let wf = Workflow::parse(&json!({"name": "g", "nodes": [http("a"), http("b"), http("c"), http("d"),
            {"id": "each", "type": "MAP", "config": {"items": [1], "node": {"type": "HTTP", "config": {"url": "http://h"}}}}],
            "edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "c", "when": ".input.x > 1"},
                      {"from": "b", "to": "d"}, {"from": "c", "to": "d"}, {"from": "d", "to": "each"}]}))
        .unwrap();
        assert_eq!(&layers(&wf)[..5], &[0, 1, 1, 2, 3]);
        let states = HashMap::from([
            ("a".to_string(), NodeState { state: "COMPLETED".into(), ..Default::default() }),
            ("b".to_string(), NodeState { state: "FAILED".into(), ..Default::default() }),
            ("each".to_string(), NodeState { state: "RUNNING".into(), note: Some("<3/10>".into()), link: None }),
        ]);
        let svg = svg(&wf, &states, &HashSet::from([("a".to_string(), "b".to_string())]));
        let svg = svg.as_str();
        assert_eq!(svg.matches("<g class=\"node").count(), 5, "the MAP's item template is not drawn");
        assert!(svg.contains("class=\"node failed\" data-node=\"b\""));
        assert!(svg.contains("class=\"node none\" data-node=\"d\""), "not reached");
        assert!(svg.contains("&lt;3/10&gt;") && !svg.contains("<3/10>"), "notes are escaped");
        assert_eq!(svg.matches("class=\"edge").count(), 5);
        assert_eq!(svg.matches("class=\"edge taken\"").count(), 1, "the edge the run took");
        assert!(svg.contains("<title>when .input.x &gt; 1</title>"));
    }

    /// Issue 51: ids of 22 characters, and notes of 14 with the state
    /// after them, ran out of their boxes.
    #[test]
    fn a_label_fits_its_box_cut_with_an_ellipsis_the_whole_in_its_title() {
        let room = (W - 2 * INSET) as f64;
        let long = "W".repeat(30);
        let shown = ID_FONT.fit(&long, room);
        // DejaVu Sans Bold's W is 1.103 em: at 13 px, 11 and the ellipsis fit in 180 px.
        assert!(shown.ends_with('…') && shown.chars().count() <= 12, "{shown}");
        assert!(ID_FONT.width(&shown) <= room);
        assert_eq!(ID_FONT.fit("charge_the_customer", room), "charge_the_customer", "a usual id is whole");
        assert_eq!(SUB_FONT.fit("WAIT_FOR_EVENT · WAITING", room), "WAIT_FOR_EVENT · WAITING", "and a usual note");
        for text in
            ["ЖЖЖЖЖЖЖЖЖЖЖЖЖЖЖЖЖЖЖЖ", "mmmmmmmmmmmmmmmmmmmmmmmm", "iiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiiii"]
        {
            assert!(ID_FONT.width(&ID_FONT.fit(text, room)) <= room, "{text}");
        }
        let wf = Workflow::parse(&json!({"name": "g", "nodes": [
            {"id": long, "type": "WAIT_FOR_EVENT", "config": {"event": "e", "key": "k"}}]}))
        .unwrap();
        let svg = svg(&wf, &HashMap::new(), &HashSet::new());
        let svg = svg.as_str();
        assert!(svg.contains(&format!("class=\"id\">{shown}</text>")), "{svg}");
        assert!(svg.contains(&format!("<title>{long} (WAIT_FOR_EVENT): NOT REACHED</title>")), "{svg}");
        let sub = svg.split("class=\"sub\">").nth(1).and_then(|s| s.split("</text>").next()).unwrap();
        assert!(sub.ends_with("… · NOT REACHED") && SUB_FONT.width(sub) <= room, "{sub}");
    }
}
