// The participant's page: one state from the server drives which section shows.
// Every text from the server or the participant is written with textContent, never as markup.
"use strict";

const token = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const $ = (id) => document.getElementById(id);
const SECTIONS = ["consent", "card", "chat", "donation", "survey", "done", "withdrawn"];
let current = null;
let events = null;

async function api(path, body) {
  const options = body === undefined ? {} : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const response = await fetch(`/api/${encodeURIComponent(token)}${path}`, options);
  let data = {};
  try { data = await response.json(); } catch (_) { data = { error: `the server answered ${response.status}` }; }
  if (!response.ok) throw new Error(data.error || `the server answered ${response.status}`);
  return data;
}

function notice(message) {
  $("notice").textContent = message || "";
  $("notice").hidden = !message;
}

async function act(fn) {
  notice("");
  try { await fn(); } catch (err) { notice(err.message); }
}

function bubble(role, text, extra) {
  const li = document.createElement("li");
  li.className = role + (extra ? " " + extra : "");
  li.textContent = text;
  $("messages").appendChild(li);
  return li;
}

function render(state) {
  current = state;
  document.title = state.title;
  $("title").textContent = state.title;
  for (const name of SECTIONS) $(name).hidden = name !== state.stage;
  $("withdraw").hidden = state.stage === "withdrawn" || state.stage === "done";
  document.querySelectorAll(".payment").forEach((el) => (el.textContent = state.payment.toFixed(2)));
  if (state.stage === "consent") $("consent-text").textContent = state.consent;
  if (state.card) { $("card-text").textContent = state.card; $("chat-card").textContent = state.card; }
  if (state.stage === "chat") renderChat(state);
  if (state.stage === "donation") renderDonation(state);
  if (state.stage === "survey") renderSurvey(state);
  if (state.stage === "done") {
    $("code").textContent = state.code;
    if (state.redirect) { $("redirect").hidden = false; $("redirect-link").href = state.redirect; }
  }
}

function renderChat(state) {
  $("messages").replaceChildren();
  for (const m of state.messages) bubble(m.role, m.content || "(no text)");
  const minutes = Math.floor(state.seconds_left / 60);
  $("limits").textContent = `${state.turns_left} message(s) left · about ${minutes} minute(s) left`;
  $("text").maxLength = state.max_message_chars;
  $("send").disabled = state.waiting || state.turns_left === 0;
  $("end").disabled = state.waiting || !state.messages.some((m) => m.role === "participant");
  $("retry").hidden = !state.error;
  if (state.error) notice(state.error);
  else if (state.waiting) listen();
}

function listen() {
  if (events) events.close();
  const pending = bubble("agent", "…", "pending");
  events = new EventSource(`/api/${encodeURIComponent(token)}/events`);
  events.addEventListener("partial", (e) => { pending.textContent = JSON.parse(e.data).text || "…"; });
  const finish = () => { events.close(); events = null; refresh(); };
  events.addEventListener("reply", finish);
  events.addEventListener("idle", finish);
  events.addEventListener("error", (e) => {
    if (e.data) notice(JSON.parse(e.data).error);
    finish();
  });
}

function renderDonation(state) {
  const d = state.donation || {};
  $("confirm-form").hidden = !d.text;
  if (d.text) {
    $("donation-text").value = d.text;
    $("donation-read").textContent = d.amount === null || d.amount === undefined
      ? "We could not read an amount from that. Please enter it as a number (0 if you give nothing):"
      : `We read this as $${d.amount.toFixed(2)}. Is that right? Correct it if not, then confirm.`;
    $("amount").max = state.payment;
    if (d.amount !== null && d.amount !== undefined) $("amount").value = d.amount.toFixed(2);
  }
}

function renderSurvey(state) {
  const form = $("survey-form");
  form.replaceChildren();
  for (const q of state.survey) {
    const set = document.createElement("fieldset");
    const legend = document.createElement("legend");
    legend.textContent = q.text;
    set.appendChild(legend);
    if (q.kind === "likert") {
      const scale = document.createElement("div");
      scale.className = "scale";
      for (let v = 1; v <= q.scale; v++) {
        const label = document.createElement("label");
        const input = document.createElement("input");
        input.type = "radio"; input.name = q.id; input.value = String(v);
        label.appendChild(input);
        label.appendChild(document.createTextNode(String(v)));
        scale.appendChild(label);
      }
      set.appendChild(scale);
    } else {
      const area = document.createElement("textarea");
      area.name = q.id; area.rows = 2; area.maxLength = state.max_message_chars;
      set.appendChild(area);
    }
    form.appendChild(set);
  }
  const submit = document.createElement("button");
  submit.type = "submit"; submit.textContent = "Finish";
  form.appendChild(submit);
}

async function refresh() { render(await api("/state")); }

document.addEventListener("DOMContentLoaded", () => {
  $("agree").addEventListener("click", () => act(async () => render(await api("/consent", {}))));
  $("disagree").addEventListener("click", () => act(withdraw));
  $("start").addEventListener("click", () => act(async () => render(await api("/start", {}))));
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    act(async () => {
      const text = $("text").value.trim();
      if (!text) throw new Error("write something before sending");
      $("send").disabled = true;
      try { await api("/messages", { text }); } catch (err) { $("send").disabled = false; throw err; }
      $("text").value = "";  // cleared only once the server has stored it
      await refresh();
    });
  });
  $("retry").addEventListener("click", () => act(async () => { await api("/retry", {}); await refresh(); }));
  $("end").addEventListener("click", () => act(async () => render(await api("/end", {}))));
  $("donation-form").addEventListener("submit", (e) => {
    e.preventDefault();
    act(async () => render(await api("/donation", { text: $("donation-text").value })));
  });
  $("confirm-form").addEventListener("submit", (e) => {
    e.preventDefault();
    act(async () => render(await api("/donation/confirm", { amount: $("amount").value })));
  });
  $("survey-form").addEventListener("submit", (e) => {
    e.preventDefault();
    act(async () => {
      const answers = {};
      for (const q of current.survey) {
        const field = e.target.elements[q.id];
        const value = field ? (field.value !== undefined ? field.value : "") : "";
        if (value !== "") answers[q.id] = q.kind === "likert" ? Number(value) : value;
      }
      render(await api("/survey", { answers }));
    });
  });
  $("withdraw").addEventListener("click", () => act(withdraw));
  act(refresh);
});

async function withdraw() {
  if (!confirm("Withdraw from the study? Everything you wrote will be deleted.")) return;
  if (events) events.close();
  await api("/withdraw", {});
  render({ ...current, stage: "withdrawn" });
}
