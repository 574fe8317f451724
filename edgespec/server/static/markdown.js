// A small Markdown renderer that keeps each character's origin: code fences, inline code, headings, lists,
// bold, italic, paragraphs. Every piece of model text is escaped before it becomes HTML; no raw HTML, no links.
// Input: pieces [{text, origin}]; output: an HTML string whose text runs are <span class="o-ORIGIN">.

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const ORIGINS = new Set(["draft", "lookup", "cache", "target"]);

export function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ESC[c]);
}

export function render(pieces) {
  let src = "";
  const starts = []; // [offset, origin], by offset
  for (const p of pieces) {
    if (!p.text) continue;
    starts.push([src.length, ORIGINS.has(p.origin) ? p.origin : "target"]);
    src += p.text;
  }
  return new Renderer(src, starts).blocks();
}

class Renderer {
  constructor(src, starts) {
    this.src = src;
    this.starts = starts;
  }

  // src[a, b) as escaped text, split at origin boundaries.
  text(a, b) {
    if (a >= b) return "";
    const st = this.starts;
    let lo = 0, hi = st.length - 1;
    while (lo < hi) { // the last piece starting at or before a
      const mid = (lo + hi + 1) >> 1;
      if (st[mid][0] <= a) lo = mid; else hi = mid - 1;
    }
    let out = "";
    for (let i = lo; i < st.length && st[i][0] < b; i++) {
      const from = Math.max(a, st[i][0]);
      const to = Math.min(b, i + 1 < st.length ? st[i + 1][0] : this.src.length);
      if (from < to) out += `<span class="o-${st[i][1]}">${escapeHtml(this.src.slice(from, to))}</span>`;
    }
    return out;
  }

  inline(a, b) {
    const s = this.src;
    let out = "", run = a, i = a;
    const flush = (to) => { out += this.text(run, to); };
    while (i < b) {
      const c = s[i];
      if (c === "`") {
        const j = s.indexOf("`", i + 1);
        if (j !== -1 && j < b) {
          flush(i);
          out += `<code>${this.text(i + 1, j)}</code>`;
          i = run = j + 1;
          continue;
        }
      } else if (c === "*" && s[i + 1] === "*") {
        const j = s.indexOf("**", i + 2);
        if (j !== -1 && j + 2 <= b && j > i + 2) {
          flush(i);
          out += `<strong>${this.inline(i + 2, j)}</strong>`;
          i = run = j + 2;
          continue;
        }
      } else if (c === "*" && s[i + 1] && !/\s/.test(s[i + 1])) {
        const j = s.indexOf("*", i + 1);
        if (j !== -1 && j < b && !/\s/.test(s[j - 1])) {
          flush(i);
          out += `<em>${this.inline(i + 1, j)}</em>`;
          i = run = j + 1;
          continue;
        }
      }
      i++;
    }
    flush(b);
    return out;
  }

  blocks() {
    const s = this.src;
    const lines = []; // [start, end) of each line, newline excluded
    for (let at = 0; at <= s.length;) {
      const nl = s.indexOf("\n", at);
      const end = nl === -1 ? s.length : nl;
      lines.push([at, end]);
      at = end + 1;
    }
    let html = "";
    let i = 0;
    const line = (k) => s.slice(lines[k][0], lines[k][1]);
    while (i < lines.length) {
      const l = line(i);
      const fence = /^\s*(```+|~~~+)\s*([\w+#.-]*)/.exec(l);
      if (fence) { // until the closing fence, or the end while it streams
        let j = i + 1;
        while (j < lines.length && !line(j).trim().startsWith(fence[1])) j++;
        const a = i + 1 < lines.length ? lines[i + 1][0] : lines[i][1];
        const b = j < lines.length ? Math.max(a, lines[j][0] - 1) : s.length;
        const lang = fence[2] ? ` data-lang="${escapeHtml(fence[2])}"` : "";
        html += `<pre><code${lang}>${this.text(a, b)}</code></pre>`;
        i = j + 1;
        continue;
      }
      if (!l.trim()) { i++; continue; }
      const heading = /^(#{1,6})\s+/.exec(l);
      if (heading) {
        const n = heading[1].length;
        html += `<h${n + 2 > 6 ? 6 : n + 2}>${this.inline(lines[i][0] + heading[0].length, lines[i][1])}</h${n + 2 > 6 ? 6 : n + 2}>`;
        i++;
        continue;
      }
      const item = /^\s*([-*+]|\d+[.)])\s+/;
      if (item.test(l)) {
        const ordered = /\d/.test(item.exec(l)[1]);
        html += ordered ? "<ol>" : "<ul>";
        while (i < lines.length && item.test(line(i))) {
          const m = item.exec(line(i));
          html += `<li>${this.inline(lines[i][0] + m[0].length, lines[i][1])}</li>`;
          i++;
        }
        html += ordered ? "</ol>" : "</ul>";
        continue;
      }
      let j = i; // a paragraph: up to a blank line or another block
      while (j + 1 < lines.length && line(j + 1).trim() && !/^\s*(```|~~~|#{1,6}\s)/.test(line(j + 1))
        && !item.test(line(j + 1))) j++;
      html += `<p>${this.inline(lines[i][0], lines[j][1])}</p>`;
      i = j + 1;
    }
    return html;
  }
}
