/**
 * The demo page served at `/`: speak typed or pasted text, pick or upload a voice, and watch the
 * time to first audio, underruns and the output waveform. The page is static and public; every API
 * call carries the key from the "API key" field (prefilled from the page's `?token=`).
 *
 * For tests and the curious, `window.voxwireClient` is the client and `window.voxwireStats` its
 * live `stats` object (both set on the first connection).
 */

import { VoxwireClient } from './client.js';

const $ = (/** @type {string} */ id) => /** @type {any} */ (document.getElementById(id));
const ui = {
  status: $('status'), model: $('model'), text: $('text'), live: $('live'), play: $('play'), stop: $('stop'),
  wave: $('wave'), level: $('level'), ttfa: $('ttfa'), underruns: $('underruns'), packets: $('packets'),
  played: $('played'), decoder: $('decoder'), segments: $('segments'), token: $('token'), voice: $('voice'), persona: $('persona'),
  format: $('format'), seed: $('seed'), lead: $('lead'), delay: $('delay'), upload: $('upload'), uploadStatus: $('upload-status'),
  error: $('error'),
};

/** @type {VoxwireClient | null} the connected client (for the display and Stop) */
let client = null;
/** @type {Promise<VoxwireClient> | null} the client once connected and configured; shared by every caller */
let connection = null;
/** Settings changed since the last `configure` (applied before the next utterance). */
let dirty = false;
/** Characters of the text box already sent in "speak as I type" mode. */
let sent = 0;
/** The text box as the last edit left it, and where the next edit's selection starts ("speak as I type"). */
let before = { value: ui.text.value, selectionStart: ui.text.value.length };

ui.token.value = new URLSearchParams(location.search).get('token') ?? '';

/** The settings the controls ask for, as client options. */
function settings() {
  const number = (/** @type {string} */ value) => (value === '' ? undefined : Number(value));
  const lead = number(ui.lead.value);
  return {
    voice: ui.voice.value,
    persona: ui.persona.value || undefined,
    format: ui.format.value,
    seed: number(ui.seed.value),
    maxBufferDelayMs: number(ui.delay.value),
    leadSeconds: lead === undefined ? undefined : lead / 1000,
  };
}

/**
 * The connected client with the current settings; the first call connects (from a user gesture).
 * Concurrent callers (keystrokes while connecting) share one promise, so text goes out in order.
 */
function session() {
  if (connection === null) {
    connection = connect().catch((error) => {
      connection = null;
      throw error;
    });
  } else if (dirty) {
    dirty = false;
    connection = connection.then((tts) =>
      tts.configure(settings()).then(
        () => tts,
        (error) => {
          showError(`settings refused: ${error.message}`); // the previous settings stay in effect
          return tts;
        },
      ),
    );
  }
  return connection;
}

async function connect() {
  const tts = new VoxwireClient({ token: ui.token.value || undefined, ...settings() });
  dirty = false;
  window.voxwireClient = tts;
  window.voxwireStats = tts.stats;
  listen(tts);
  await tts.connect();
  client = tts;
  return tts;
}

/** @param {VoxwireClient} tts */
function listen(tts) {
  tts.addEventListener('ready', (e) => {
    setStatus('connected', 'on');
    const { model, format, sample_rate: rate } = e.detail;
    const name = model.startsWith('/') ? model.split('/').pop() : model; // a local checkpoint: its folder name
    ui.model.textContent = `${name} · ${format} · ${rate} Hz`;
  });
  tts.addEventListener('firstAudio', (e) => { ui.ttfa.textContent = `${Math.round(e.detail.latencyMs)} ms`; });
  tts.addEventListener('segment', (e) => {
    const item = document.createElement('li');
    item.textContent = e.detail.text;
    ui.segments.append(item);
    item.scrollIntoView({ block: 'nearest' });
  });
  tts.addEventListener('error', (e) => showError(`${e.detail.code}: ${e.detail.message}`));
  tts.addEventListener('interrupted', (e) => showError(`connection lost (${e.detail.code}): the rest of that utterance is skipped`));
  tts.addEventListener('reconnect', () => setStatus('connected', 'on'));
  tts.addEventListener('close', (e) => {
    if (e.detail.reconnecting) {
      setStatus(`reconnecting (${e.detail.code})`, 'off'); // the client resumes on a new connection
      return;
    }
    setStatus(`closed (${e.detail.code})`, 'off');
    forget(tts);
  });
  tts.addEventListener('error', (e) => {
    if (e.detail.code === 'reconnect_failed') forget(tts);
  });
}

/** The next utterance opens a new client (this one is closed for good). @param {VoxwireClient} tts */
function forget(tts) {
  if (client === tts) {
    client = null;
    connection = null;
  }
}

async function play() {
  const tts = await session();
  if (tts.speaking) tts.cancel(); // a new Play replaces what is speaking
  ui.segments.replaceChildren();
  tts.text(ui.text.value);
  tts.end();
  sent = ui.text.value.length;
}

async function stop() {
  client?.cancel();
  sent = ui.text.value.length; // what is typed after Stop starts a new utterance
}

/**
 * Where an edit of the text box began: at the start of the selection it replaced (typing over selected
 * text replaces it from there, whatever its first character was) or earlier, where the old and new text
 * first differ (a backspace).
 * @param {string} value the box after the edit
 */
function editStart(value) {
  let common = 0;
  while (common < value.length && value[common] === before.value[common]) common++;
  return Math.min(common, before.selectionStart);
}

/** "Speak as I type": send each completed word; Enter ends the utterance. */
async function typed() {
  const value = ui.text.value;
  const start = editStart(value);
  before = { value, selectionStart: value.length };
  if (!ui.live.checked) return;
  // Words already sent cannot be unsaid; what the edit wrote from `start` on is new text, to be sent.
  sent = Math.min(sent, start);
  const lastSpace = Math.max(value.lastIndexOf(' '), value.lastIndexOf('\n'));
  if (lastSpace + 1 <= sent) return;
  const words = value.slice(sent, lastSpace + 1);
  sent = lastSpace + 1;
  (await session()).text(words);
}

async function endTyped() {
  const rest = ui.text.value.slice(sent);
  sent = ui.text.value.length;
  const tts = await session();
  if (rest) tts.text(rest);
  if (tts.isOpen()) tts.end();
}

/** The API key as an `Authorization` header (the page itself needs none). */
function auth() {
  return ui.token.value ? { Authorization: `Bearer ${ui.token.value}` } : {};
}

async function loadVoices() {
  const response = await fetch('/v1/voices', { headers: auth() });
  if (!response.ok) {
    showError(response.status === 401 ? 'enter the API key to list voices' : `voices: HTTP ${response.status}`);
    return;
  }
  const { data } = await response.json();
  const chosen = ui.voice.value;
  ui.voice.replaceChildren(new Option('default', 'default'));
  // The built-in voices (`default` and OpenAI's names) are all the model's own voice: `default` stands for them.
  const saved = data.filter((voice) => !voice.builtin);
  for (const voice of saved) ui.voice.append(new Option(`${voice.name} (${voice.duration_s.toFixed(1)} s)`, voice.id));
  ui.voice.value = [...ui.voice.options].some((option) => option.value === chosen) ? chosen : 'default';
}

/** The LoRA personas loaded on the server (`GET /v1/loras`); "none" speaks with the base model. */
async function loadPersonas() {
  const response = await fetch('/v1/loras', { headers: auth() });
  if (!response.ok) return; // loadVoices reports a missing key
  const { data } = await response.json();
  const chosen = ui.persona.value;
  ui.persona.replaceChildren(new Option('none', ''));
  for (const persona of data) ui.persona.append(new Option(`${persona.name} (rank ${persona.rank})`, persona.name));
  ui.persona.value = [...ui.persona.options].some((option) => option.value === chosen) ? chosen : '';
}

/** @param {SubmitEvent} event */
async function upload(event) {
  event.preventDefault();
  ui.uploadStatus.textContent = 'encoding…';
  const form = new FormData(ui.upload);
  for (const name of ['transcript', 'name']) if (form.get(name) === '') form.delete(name); // empty means none
  const response = await fetch('/v1/voices', { method: 'POST', headers: auth(), body: form });
  const body = await response.json();
  if (!response.ok) {
    ui.uploadStatus.textContent = '';
    showError(`upload: ${body.error.code}: ${body.error.message}`);
    return;
  }
  await loadVoices();
  ui.voice.value = body.id;
  ui.uploadStatus.textContent = `saved as ${body.id}`; // once the new voice is listed and chosen
  dirty = true;
}

/** @param {string} text @param {'on' | 'off'} kind */
function setStatus(text, kind) {
  ui.status.textContent = text;
  ui.status.className = `pill ${kind}`;
}

/** @param {string} message */
function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = false;
  setTimeout(() => { ui.error.hidden = true; }, 6000);
}

/** Redraw the waveform, level and counters every animation frame. */
function draw() {
  const analyser = client?.analyser;
  const canvas = ui.wave;
  const g = canvas.getContext('2d');
  g.clearRect(0, 0, canvas.width, canvas.height);
  g.strokeStyle = '#5b9bff';
  g.beginPath();
  let peak = 0;
  if (analyser) {
    const samples = new Float32Array(analyser.fftSize);
    analyser.getFloatTimeDomainData(samples);
    for (let i = 0; i < samples.length; i++) {
      const x = (i / samples.length) * canvas.width;
      const y = (0.5 - samples[i] / 2) * canvas.height;
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
      peak = Math.max(peak, Math.abs(samples[i]));
    }
  } else {
    g.moveTo(0, canvas.height / 2);
    g.lineTo(canvas.width, canvas.height / 2);
  }
  g.stroke();
  ui.level.style.width = `${Math.min(100, peak * 100)}%`;
  if (client) {
    const { stats } = client;
    ui.underruns.textContent = String(stats.underruns);
    ui.packets.textContent = String(stats.packetsDecoded);
    ui.played.textContent = `${(stats.samplesPlayed / (client.player?.sampleRate ?? 48_000)).toFixed(2)} s`;
    ui.decoder.textContent = stats.decoder ?? '–';
  }
  requestAnimationFrame(draw);
}

const guard = (/** @type {(...args: any[]) => Promise<void>} */ action) => (/** @type {any[]} */ ...args) =>
  action(...args).catch((error) => showError(error.message ?? String(error)));

ui.play.addEventListener('click', guard(play));
ui.stop.addEventListener('click', guard(stop));
ui.text.addEventListener('beforeinput', () => {
  before = { value: ui.text.value, selectionStart: ui.text.selectionStart };
});
ui.text.addEventListener('input', guard(typed));
ui.text.addEventListener('keydown', (/** @type {KeyboardEvent} */ event) => {
  if (ui.live.checked && event.key === 'Enter' && !event.shiftKey) {
    event.preventDefault();
    guard(endTyped)();
  }
});
ui.live.addEventListener('change', () => { sent = ui.text.value.length; });
for (const control of [ui.voice, ui.persona, ui.format, ui.seed, ui.lead, ui.delay]) control.addEventListener('change', () => { dirty = true; });
ui.token.addEventListener('change', guard(async () => {
  await client?.close(); // a new key needs a new connection
  client = null;
  connection = null;
  await loadVoices();
  await loadPersonas();
}));
ui.upload.addEventListener('submit', guard(upload));
guard(loadVoices)();
guard(loadPersonas)();
requestAnimationFrame(draw);
