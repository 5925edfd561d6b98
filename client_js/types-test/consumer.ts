// Uses both entry points of voxwire-client by the package's name, so the declarations are checked, not just
// present. Results are left to inference, and a `@ts-expect-error` line after each fails the build when the
// type it guards has turned into `any` (the error it expects no longer happens).
import {
  ProtocolError,
  RefusedError,
  STREAM_PATH,
  VoxwireClient,
  VoxwireContext,
  streamUrl,
  supportsOpus,
  type ClientError,
  type ClientOptions,
  type ClientStats,
  type FirstAudio,
  type ReadyMessage,
} from 'voxwire-client';
import {
  ErrorCode,
  FRAME_FORMATS,
  audioFrameOf,
  decodeFrame,
  decodeServer,
  encodeClient,
  type AudioFormat,
  type AudioFrame,
  type ClientMessage,
  type ServerMessage,
} from 'voxwire-client/protocol';

const options: ClientOptions = {
  url: 'https://tts.example.com',
  token: 'KEY',
  voice: 'default',
  format: 'opus',
  leadSeconds: 0.2,
  retry: { retries: 3 },
};
const tts = new VoxwireClient(options);
// @ts-expect-error: there is no such option
new VoxwireClient({ voice: 'default', pitch: 2 });
// @ts-expect-error: only the formats a browser plays
new VoxwireClient({ format: 'mp3' });
// The worklet from the app's own URL, and a WebSocket implementation of the app's choice.
new VoxwireClient({ workletUrl: new URL('/assets/worklet.js', 'https://app.example'), WebSocket });
// @ts-expect-error: a WebSocket constructor, not a socket
new VoxwireClient({ WebSocket: new WebSocket('wss://tts.example.com') });

tts.addEventListener('firstAudio', (event) => {
  const latencyMs: number = event.detail.latencyMs;
  const decodedMs: number | null = event.detail.decodedMs;
  // @ts-expect-error: a latency is a number
  const wrong: string = event.detail.latencyMs;
  console.log(latencyMs, decodedMs, wrong);
});
tts.addEventListener('done', (event) => {
  const reason: string = event.detail.finish_reason;
  const audioSeconds: number = event.detail.audio_s;
  const ttfaSeconds: number | null = event.detail.ttfa_s;
  // @ts-expect-error: optional fields of a decoded message are null when unknown
  const alwaysKnown: number = event.detail.ttfa_s;
  console.log(reason, audioSeconds, ttfaSeconds, alwaysKnown);
});
tts.addEventListener('segment', ({ detail }) => console.log(detail.index, detail.text.length));
tts.addEventListener('error', (event) => {
  const error: ClientError = event.detail;
  const utterance: number | null = error.utterance;
  console.warn(error.code, error.message, utterance);
});
tts.addEventListener('underrun', ({ detail }) => console.warn('the buffer ran dry', detail.utterance));
tts.addEventListener('close', ({ detail }) => console.log(detail.code, detail.reason, detail.reconnecting));
tts.addEventListener('retry', ({ detail }) => console.log(detail.retry, detail.delayMs, detail.reason));
tts.addEventListener('interrupted', ({ detail }) => console.log(detail.utterances.map((n) => n + 1)));
const onReady = (event: CustomEvent<ReadyMessage>): void => console.log(event.detail.sample_rate);
tts.addEventListener('ready', onReady);
tts.removeEventListener('ready', onReady);
// @ts-expect-error: `ready` carries the ready message, not a first-audio record
tts.addEventListener('ready', (event: CustomEvent<FirstAudio>) => console.log(event.detail.latencyMs));
// Any other event name is EventTarget's own.
tts.addEventListener('visibilitychange', (event: Event) => console.log(event.type));

async function speak(pieces: AsyncIterable<string>): Promise<void> {
  const ready = await tts.connect();
  const sampleRate: number = ready.sample_rate;
  const voice: string | null = ready.voice;
  console.log(ready.model, sampleRate, voice, ready.chunk_s);
  // @ts-expect-error: a sample rate is a number
  const rateText: string = ready.sample_rate;
  for await (const piece of pieces) tts.text(piece);
  tts.flush();
  tts.end();
  const settings: ReadyMessage | null = tts.settings;
  // @ts-expect-error: the settings are a ready message (or null)
  const settingsText: string = tts.settings;
  const stats: ClientStats = tts.stats;
  // @ts-expect-error: the counters are numbers
  const underrunsText: string = tts.stats.underruns;
  const firstAudio: FirstAudio | null = stats.firstAudio;
  const decoder: 'webcodecs' | 'pcm' | null = stats.decoder;
  console.log(settingsText, underrunsText);
  console.log(settings?.format, stats.underruns, stats.samplesPlayed, firstAudio?.latencyMs, decoder);
  const analyser: AnalyserNode | null = tts.analyser;
  const speaking: boolean = tts.speaking;
  if (speaking) tts.cancel();
  console.log(analyser?.frequencyBinCount, rateText);
  const changed = await tts.configure({ voice: 'alice', seed: 7, maxBufferDelayMs: 300 });
  // @ts-expect-error: configure() resolves with the new ready message
  const changedRate: string = changed.sample_rate;
  console.log(changedRate);
  const next: VoxwireContext = tts.context('turn-2');
  const nextReady: ReadyMessage = await next.configure({ voice: 'bob', seed: 3 });
  const nextId: string | undefined = nextReady.context_id;
  // @ts-expect-error: a context shares the client's format
  await next.configure({ format: 'pcm_s16le' });
  next.text('Prefetched. ');
  next.end();
  tts.cancel('turn-2');
  next.close();
  console.log(nextId, tts.isOpen('turn-2'));
  await tts.close();
  // @ts-expect-error: the client's bookkeeping is private
  console.log(tts.readyWaiters);
}

async function* words(): AsyncGenerator<string> {
  yield 'Hello ';
  yield 'there. ';
}

speak(words()).catch((error: unknown) => {
  if (error instanceof RefusedError) console.warn('the server stays busy:', error.message);
  else if (error instanceof ProtocolError) console.warn('refused:', error.code);
  else throw error;
});
const url: string = streamUrl('https://tts.example.com', 'KEY');
const opus: Promise<boolean> = supportsOpus();
console.log(url, opus, STREAM_PATH);

// The protocol codec, e.g. for a server-side or a custom client.
const message = decodeServer('{"type":"error","code":"busy","message":"later","utterance":null}');
switch (message.type) {
  case 'ready':
    console.log(message.chunk_s + 0, message.pre_skip + 0);
    break;
  case 'segment':
    console.log(message.start_sample + 0, message.spoken.trim());
    break;
  case 'words': {
    const ends: number[] = message.ends_s;
    console.log(message.words.join(' '), (message.starts_s[0] ?? 0) + (ends[0] ?? 0));
    break;
  }
  case 'done':
    console.log(message.segments + 0, message.buffer_s ?? 0);
    break;
  case 'error': {
    const utterance: number | null = message.utterance;
    console.log(message.code === ErrorCode.INVALID_FIELD, utterance);
    break;
  }
  case 'audio': {
    const audio: AudioFrame = audioFrameOf(message);
    const context: string | null | undefined = audio.context_id;
    console.log(audio.packets.length, context);
    break;
  }
  default: {
    const unreachable: never = message;
    console.log(unreachable);
  }
}
const start: ClientMessage = { type: 'start', voice: 'default', format: 'pcm_f32le', seed: null };
const telephony: ClientMessage = { type: 'start', format: 'pcm_mulaw', sample_rate: 8000, audio_transport: 'json' };
const closing: ClientMessage = { type: 'close_context', context_id: 'turn-2' };
// @ts-expect-error: close_context names its context
encodeClient({ type: 'close_context' });
console.log(encodeClient(telephony), encodeClient(closing));
const frames: string[] = [encodeClient(start), encodeClient({ type: 'text', text: 'Hello' }), encodeClient({ type: 'end' })];
// @ts-expect-error: a text message needs its text
encodeClient({ type: 'text' });
// @ts-expect-error: there is no such message type
encodeClient({ type: 'stop' });
// @ts-expect-error: seed is a number
encodeClient({ type: 'start', seed: '7' });
const frame = decodeFrame(new Uint8Array([1, 2, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
const sameFrame: AudioFrame = frame;
// @ts-expect-error: a frame's format is one of FRAME_FORMATS
const formatNumber: number = frame.format;
const format: AudioFormat = frame.format;
const formats: readonly AudioFormat[] = FRAME_FORMATS;
const packets: Uint8Array[] = frame.packets;
const decoded: ServerMessage = message;
console.log(frames, format, formats, packets.length, sameFrame.utterance + frame.sequence, formatNumber, decoded);
