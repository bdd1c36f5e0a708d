// A live Plotly chart that keeps the user's view (zoom, pan, legend clicks) across Streamlit reruns
// (app_pages/_plotly_live.py). Streamlit calls the default export on every render whose data changed, with
// the same parent element while the keyed element stays mounted: one plot div lives in it, and each new
// figure goes through Plotly.react, which keeps what the user changed as long as layout.uirevision stays.

// plotly.js is loaded once per page from the lab's own server (no CDN: the lab works offline): the copy the
// plotly package ships, the version that wrote the figures. This module is imported once per page (Streamlit
// caches it by its content), so every chart shares the promise. The script sets window.Plotly; the page's
// previous window.Plotly (Streamlit's st.plotly_chart may have one, another version) is put back, and ours is
// window.PlotlyLive.
let loading = null;

function loadPlotly(src) {
  if (window.PlotlyLive) return Promise.resolve(window.PlotlyLive);
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const had = Object.prototype.hasOwnProperty.call(window, "Plotly"), before = window.Plotly;
      const script = document.createElement("script");
      script.src = src;
      script.async = true;
      script.onload = () => {
        window.PlotlyLive = window.Plotly;
        if (had) window.Plotly = before; else delete window.Plotly;
        resolve(window.PlotlyLive);
      };
      script.onerror = () => {
        loading = null; // a later render tries again
        reject(new Error(`plotly.js did not load from ${src}`));
      };
      document.head.appendChild(script);
    });
  }
  return loading;
}

// Plotly matches a redrawn trace to the old one (and so to its legend click) by uid, else by index: a run
// that joins the comparison adds traces in the middle, so each trace gets a uid from what it shows. Plotly
// puts the uid in CSS selectors, hence a hash of it (letters and digits only).
function hash(text) {
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  return (h >>> 0).toString(36);
}

function withUids(traces) {
  const seen = new Map();
  for (const t of traces) {
    if (t.uid) continue;
    const base = "t" + hash([t.name, t.meta, t.legendgroup, t.xaxis, t.yaxis, t.type].map(v => v ?? "").join("|"));
    const n = seen.get(base) || 0;
    seen.set(base, n + 1);
    t.uid = n ? `${base}-${n}` : base;
  }
  return traces;
}

// One draw at a time per chart, and only the newest figure: a figure that arrives while plotly.js loads or
// while the previous draw runs replaces the one waiting.
function draw(Plotly, gd) {
  if (gd._liveBusy || !gd._livePending) return;
  const { figure, config } = gd._livePending;
  gd._livePending = null;
  gd._liveBusy = true;
  const layout = figure.layout || {};
  delete layout.width; // the chart fills its column, as st.plotly_chart's do
  layout.autosize = true;
  Promise.resolve(Plotly.react(gd, withUids(figure.data || []), layout, config))
    .then(() => { gd.dataset.updates = String(Number(gd.dataset.updates || 0) + 1); })
    .catch(err => console.error("plotly_live: drawing failed", err))
    .finally(() => { gd._liveBusy = false; draw(Plotly, gd); });
}

export default function (component) {
  const { data, parentElement } = component;
  if (!data || !data.figure) return;
  let gd = parentElement.querySelector(":scope > .plotly-live");
  if (!gd) {
    gd = document.createElement("div");
    gd.className = "plotly-live";
    gd.style.width = "100%";
    gd.dataset.updates = "0";
    parentElement.appendChild(gd);
  }
  gd.style.height = `${data.height}px`;
  gd._livePending = { figure: JSON.parse(data.figure), config: data.config };
  loadPlotly(data.src)
    .then(Plotly => draw(Plotly, gd))
    .catch(err => {
      console.error("plotly_live:", err);
      gd.textContent = String(err.message || err);
    });
}
