// The task page's live view: follows the task's stream and appends its reply as it is produced.
const out = document.getElementById("live");
if (out) {
  const state = document.getElementById("live-state");
  const source = new EventSource(out.dataset.src);
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.replace !== undefined) out.textContent = event.replace;
    if (event.newline && out.textContent) out.textContent += "\n";
    if (event.text !== undefined) out.textContent += event.text;
    if (event.state) state.textContent = event.state;
    if (event.done) source.close();
  };
  source.onerror = () => { state.textContent += " (live view disconnected; reload to follow again)"; source.close(); };
}
