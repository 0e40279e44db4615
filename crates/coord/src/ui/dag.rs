//! A run's graph as SVG: nodes in layers by their longest path from a root
//! (so every edge points right), coloured by their task's state.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use composer_core::definition::{EdgeOn, Workflow};

use super::html::{clip, esc, state_class};

const W: usize = 170;
const H: usize = 46;
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

/// The SVG of `wf`, each node coloured by `states` (by node id; a node
/// without one was not reached), the edges the run took (`taken`, `(from,
/// to)` node ids) drawn bold; failure and always edges have their own look.
pub fn svg(wf: &Workflow, states: &HashMap<String, NodeState>, taken: &HashSet<(String, String)>) -> String {
    let layer = layers(wf);
    let graph: Vec<usize> = (0..wf.nodes.len()).filter(|&n| wf.nodes[n].item_of.is_none()).collect();
    let mut row = vec![0; wf.nodes.len()];
    let mut per_layer: HashMap<usize, usize> = HashMap::new();
    for &n in &graph {
        let r = per_layer.entry(layer[n]).or_default();
        row[n] = *r;
        *r += 1;
    }
    let columns = graph.iter().map(|&n| layer[n] + 1).max().unwrap_or(1);
    let rows = per_layer.values().copied().max().unwrap_or(1);
    let width = PAD * 2 + columns * W + (columns - 1) * GAP_X;
    let height = PAD * 2 + rows * H + (rows - 1) * GAP_Y;
    let at = |n: usize| (PAD + layer[n] * (W + GAP_X), PAD + row[n] * (H + GAP_Y));
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg class=\"dag\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} {height}\" width=\"{width}\" \
         height=\"{height}\" role=\"img\" aria-label=\"the run's graph\"><defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" \
         refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">\
         <path d=\"M 0 0 L 10 5 L 0 10 z\"/></marker></defs>"
    );
    for e in &wf.edges {
        let ((x1, y1), (x2, y2)) = (at(e.from), at(e.to));
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
            EdgeOn::Success => String::new(),
            other => format!("on {}", other.as_str()),
        };
        let when = e.when.as_ref().map(|w| format!("when {}", w.source())).unwrap_or_default();
        let title = match (on.is_empty(), when.is_empty()) {
            (true, true) => String::new(),
            (false, false) => format!("<title>{} · {}</title>", esc(&on), esc(&when)),
            _ => format!("<title>{}{}</title>", esc(&on), esc(&when)),
        };
        let _ = write!(
            out,
            "<path class=\"{class}\" d=\"M {sx} {sy} C {mid} {sy}, {mid} {ty}, {tx} {ty}\" marker-end=\"url(#arrow)\">{title}</path>"
        );
    }
    for &n in &graph {
        let node = &wf.nodes[n];
        let (x, y) = at(n);
        let s = states.get(&node.id);
        let state = s.map(|s| s.state.as_str()).unwrap_or("NOT REACHED");
        let note = s.and_then(|s| s.note.clone()).unwrap_or_else(|| node.node_type.clone());
        let body = format!(
            "<rect x=\"{x}\" y=\"{y}\" width=\"{W}\" height=\"{H}\" rx=\"6\"/>\
             <text x=\"{}\" y=\"{}\" class=\"id\">{}</text><text x=\"{}\" y=\"{}\" class=\"sub\">{} · {}</text>\
             <title>{} ({}): {}</title>",
            x + 10,
            y + 19,
            esc(&clip(&node.id, 22)),
            x + 10,
            y + 36,
            esc(&clip(&note, 14)),
            esc(state),
            esc(&node.id),
            esc(&node.node_type),
            esc(state)
        );
        let class = state_class(state);
        match s.and_then(|s| s.link.as_deref()) {
            Some(link) => {
                let _ = write!(
                    out,
                    "<a href=\"{}\"><g class=\"node {class}\" data-node=\"{}\">{body}</g></a>",
                    esc(link),
                    esc(&node.id)
                );
            }
            None => {
                let _ = write!(out, "<g class=\"node {class}\" data-node=\"{}\">{body}</g>", esc(&node.id));
            }
        }
    }
    out.push_str("</svg>");
    out
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
        assert_eq!(svg.matches("<g class=\"node").count(), 5, "the MAP's item template is not drawn");
        assert!(svg.contains("class=\"node failed\" data-node=\"b\""));
        assert!(svg.contains("class=\"node none\" data-node=\"d\""), "not reached");
        assert!(svg.contains("&lt;3/10&gt;") && !svg.contains("<3/10>"), "notes are escaped");
        assert_eq!(svg.matches("class=\"edge").count(), 5);
        assert_eq!(svg.matches("class=\"edge taken\"").count(), 1, "the edge the run took");
        assert!(svg.contains("<title>when .input.x &gt; 1</title>"));
    }
}
