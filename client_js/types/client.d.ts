/**
 * The WebSocket URL of the stream endpoint.
 * @param {string | undefined} url `http(s)://` or `ws(s)://` server or endpoint; default this page's server
 * @param {string | undefined} token
 */
export function streamUrl(url: string | undefined, token: string | undefined): string;
export { ProtocolError } from "./protocol.js";
export { RefusedError } from "./reconnect.js";
export { supportsOpus } from "./player.js";
export const STREAM_PATH: "/v1/tts/stream";
/**
 * @typedef {object} ClientOptions
 * @property {string} [url] server (`http(s)://` or `ws(s)://` host, or the full endpoint URL); default: this page's server
 * @property {string} [token] API key, sent as the `token` query parameter (browsers cannot set WebSocket headers)
 * @property {'opus' | 'pcm_f32le' | 'pcm_s16le'} [format] `opus` (default) falls back to `pcm_f32le` without WebCodecs Opus
 * @property {string} [voice] a saved voice id, or `default`
 * @property {number} [seed] segment k of each utterance uses seed + k
 * @property {number} [cfgValue]
 * @property {number} [inferenceTimesteps]
 * @property {number} [maxBufferDelayMs] how long an incomplete sentence waits for more text
 * @property {boolean} [normalize] read numbers, dates and money as words (the server needs `voxwire[normalize]`)
 * @property {string} [persona] a LoRA persona loaded on the server (`GET /v1/loras`); default: the base model
 * @property {string} [instructions] VoxCPM2's voice design: a description of the voice, for every sentence
 * @property {number} [speed] speaking speed, 0.25 to 4.0, pitch kept (default 1.0)
 * @property {number} [leadSeconds] audio buffered before playback starts; default one model chunk (`ready.chunk_s`)
 * @property {Partial<import('./reconnect.js').RetryPolicy>} [retry] how a refused connection is retried
 * @property {boolean} [reconnect] open a new connection when the session is lost (default true)
 * @property {string | URL} [workletUrl] where the player loads its AudioWorklet module (voxwire-client's
 *   `worklet.js`) from; default: the copy built into the library, as a Blob URL (which a Content-Security-Policy
 *   without `blob:` scripts refuses)
 * @property {WebSocketClass} [WebSocket] the WebSocket implementation; default: the global `WebSocket`
 *   (pass e.g. the `ws` package's where there is none, as in Node before 22)
 */
/**
 * Live counters, updated in place (a page may expose the object itself, e.g. `window.voxwireStats`).
 * @typedef {import('./player.js').PlayerStats & {
 *   decoder: 'webcodecs' | 'pcm' | null,
 *   framesReceived: number,
 *   framesDropped: number,
 *   utterancesDone: number,
 *   firstAudio: FirstAudio | null,
 * }} ClientStats
 */
/**
 * Milliseconds from an utterance's first `text()` to its first sample played (`latencyMs`), to its first
 * frame received and to its first audio decoded (null when not seen, e.g. PCM is not decoded).
 * @typedef {{utterance: number, latencyMs: number, receivedMs: number | null, decodedMs: number | null}} FirstAudio
 */
/** @typedef {new (url: string) => WebSocket} WebSocketClass a WebSocket constructor, the browser's or a compatible one */
/** @typedef {{textAt: number, receivedAt: number | null, decodedAt: number | null}} Timing */
/**
 * A failure: the server's `error` message, or one of the client's own (`utterance` null), e.g. `decode_failed`,
 * `bad_frame`, or `reconnect_failed` when a lost session could not be resumed. Branch on `code`.
 * @typedef {{code: string, message: string, utterance: number | null}} ClientError
 */
/**
 * The events a client dispatches, by name, and the `detail` each carries.
 * @typedef {object} ClientEvents
 * @property {ReadyMessage} ready the settings in effect (after `connect()`, `configure()` and a reconnection)
 * @property {SegmentMessage} segment a sentence starts
 * @property {WordsMessage} words when some of a sentence's words are spoken (estimated from its audio, after its frames; a sentence's words may come in several parts, in order)
 * @property {FirstAudio} firstAudio an utterance's first sample played
 * @property {DoneMessage} done an utterance is finished (its audio may still be playing)
 * @property {{utterance: number}} underrun the buffer ran dry mid-sentence
 * @property {ClientError} error
 * @property {{code: number, reason: string, reconnecting: boolean}} close the connection closed
 * @property {{retry: number, delayMs: number, reason: string}} retry a refused connection is tried again
 * @property {{utterances: number[], code: number, reason: string}} interrupted the connection was lost (1001,
 *   1006) before these utterances were done; what was received still plays, the rest of them is skipped
 * @property {{}} reconnect a new connection took over; text sent meanwhile went to it
 */
/**
 * The settings a context may choose for itself; the format, lead and connection are the client's.
 * @typedef {Pick<ClientOptions, 'voice' | 'seed' | 'cfgValue' | 'inferenceTimesteps' | 'maxBufferDelayMs' |
 *   'normalize' | 'persona' | 'instructions' | 'speed'>} ContextOptions
 */
/**
 * Audio of an utterance that must wait for the utterances opened before it, and whether its `done` came.
 * @typedef {{frames: {frame: AudioFrame, segmentStart: boolean}[], done: boolean}} Held
 */
/**
 * A listener of one of the client's events.
 * @template {keyof ClientEvents} Name
 * @typedef {(this: VoxwireClient, event: CustomEvent<ClientEvents[Name]>) => void} ClientListener
 */
/**
 * @typedef {import('./protocol.js').ClientMessage} ClientMessage
 * @typedef {import('./protocol.js').AudioFrame} AudioFrame
 * @typedef {import('./protocol.js').ReadyMessage} ReadyMessage
 * @typedef {import('./protocol.js').SegmentMessage} SegmentMessage
 * @typedef {import('./protocol.js').WordsMessage} WordsMessage
 * @typedef {import('./protocol.js').DoneMessage} DoneMessage
 */
export class VoxwireClient extends EventTarget {
    /** @param {ClientOptions} [options] */
    constructor(options?: ClientOptions);
    /** @type {ClientOptions} the options in effect (`configure()` changes them) */
    options: ClientOptions;
    /** @type {ClientStats} */
    stats: ClientStats;
    /** @type {ReadyMessage | null} the settings in effect */
    settings: ReadyMessage | null;
    /** @type {WebSocket | null} the current connection */
    socket: WebSocket | null;
    /** @type {Player | null} the current audio output */
    player: Player | null;
    /** Number the server will give the next utterance (it counts them per connection, from 0). */
    nextUtterance: number;
    /** @private @type {Map<string | null, number>} each context's utterance taking text (null: the default context) */
    private openUtterances;
    /** @private @type {Map<number, string | null>} the context of each utterance not done yet */
    private utteranceContexts;
    /** @private @type {Set<number>} utterances cancelled and not done yet: their frames are dropped on arrival */
    private cancelled;
    /** @private The utterance whose audio goes to the player now; later ones wait in `held`. */
    private head;
    /** @private @type {Map<number, Held>} audio of utterances after `head`, in arrival order */
    private held;
    /** @type {Map<string, ContextOptions>} the named contexts this client opened, with their settings */
    contexts: Map<string, ContextOptions>;
    /** @private @type {Map<number, Timing>} utterances whose first audio has not played yet */
    private timings;
    /** @private @type {Set<number>} utterances whose next frame starts a sentence (a `segment` came) */
    private segmentStarts;
    /** @private @type {number | null} the player's lead, in seconds */
    private lead;
    /** @private @type {{resolve: (ready: ReadyMessage) => void, reject: (error: Error) => void}[]} */
    private readyWaiters;
    /** @private The client's number of the current connection's utterance 0 (the server counts per connection). */
    private base;
    /** @private @type {Promise<void> | null} a lost session's replacement, while it connects */
    private reconnecting;
    /** @private @type {ClientMessage[]} messages sent while reconnecting, in order */
    private queued;
    /** @private Set by `close()`: a close we asked for is not a loss. */
    private closing;
    /**
     * Listen to one of the client's events (`ClientEvents` says what each carries).
     * @template {keyof ClientEvents} Name
     * @overload
     * @param {Name} type
     * @param {ClientListener<Name>} listener
     * @param {boolean | AddEventListenerOptions} [options]
     * @returns {void}
     */
    addEventListener<Name extends keyof ClientEvents>(type: Name, listener: ClientListener<Name>, options?: boolean | AddEventListenerOptions | undefined): void;
    /**
     * @overload
     * @param {string} type
     * @param {EventListenerOrEventListenerObject | null} listener
     * @param {boolean | AddEventListenerOptions} [options]
     * @returns {void}
     */
    addEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | AddEventListenerOptions | undefined): void;
    /**
     * @template {keyof ClientEvents} Name
     * @overload
     * @param {Name} type
     * @param {ClientListener<Name>} listener
     * @param {boolean | EventListenerOptions} [options]
     * @returns {void}
     */
    removeEventListener<Name extends keyof ClientEvents>(type: Name, listener: ClientListener<Name>, options?: boolean | EventListenerOptions | undefined): void;
    /**
     * @overload
     * @param {string} type
     * @param {EventListenerOrEventListenerObject | null} listener
     * @param {boolean | EventListenerOptions} [options]
     * @returns {void}
     */
    removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | EventListenerOptions | undefined): void;
    /** Whether an utterance is not done yet or its audio is still playing (a `cancel()` would cut something). */
    get speaking(): boolean;
    /**
     * Whether the context has an utterance taking text (an `end()` would close it).
     * @param {string} [contextId] omitted: the default context
     */
    isOpen(contextId?: string): boolean;
    /** The analyser after the player, for level meters and waveforms (null before `connect`). */
    get analyser(): AnalyserNode | null;
    /**
     * Open the session and apply the options; resolves with the `ready` message in effect.
     * Call it from a user gesture so that the audio context may start.
     * @returns {Promise<ReadyMessage>}
     * @throws {RefusedError} when the server still refuses after the `retry` policy's attempts
     * @throws {ProtocolError} when the server refuses the settings (e.g. an unknown voice)
     */
    connect(): Promise<ReadyMessage>;
    /**
     * Change settings between utterances (voice, format, seed, ...); resolves with the new `ready`. With a
     * `contextId`, the settings of that context only (made if new; format and lead stay the client's).
     * @param {ClientOptions} changes
     * @param {string} [contextId]
     * @returns {Promise<ReadyMessage>}
     * @throws {ProtocolError} when the server refuses the settings (or has `max_contexts` open: `too_many_contexts`)
     */
    configure(changes: ClientOptions, contextId?: string): Promise<ReadyMessage>;
    /**
     * A handle on one context of this connection: the client's methods with `contextId` filled in.
     * @param {string} contextId 1 to 64 UTF-8 bytes
     */
    context(contextId: string): VoxwireContext;
    /**
     * Append text to the utterance (opening one if none is); send the spaces between words.
     * @param {string} text
     * @param {string} [contextId] the context (omitted: the default context)
     */
    text(text: string, contextId?: string): void;
    /**
     * Speak what is buffered now, even an incomplete sentence; the utterance stays open.
     * @param {string} [contextId]
     */
    flush(contextId?: string): void;
    /**
     * Close the utterance: the rest of its text is spoken, then `done`.
     * @param {string} [contextId]
     */
    end(contextId?: string): void;
    /**
     * Barge-in: stop every utterance of the context, silence its playback at once, and drop its frames still on the
     * way; other contexts go on.
     * @param {string} [contextId]
     */
    cancel(contextId?: string): void;
    /**
     * Cancel a named context and forget it on the server, freeing its slot (`max_contexts`).
     * @param {string} contextId
     */
    closeContext(contextId: string): void;
    /** Close the connection and the audio context. */
    close(): Promise<void>;
    #private;
}
/** One context of a client's connection: the client's methods, with the context id filled in. */
export class VoxwireContext {
    /**
     * @param {VoxwireClient} client
     * @param {string} id
     */
    constructor(client: VoxwireClient, id: string);
    client: VoxwireClient;
    id: string;
    /**
     * This context's settings; resolves with its `ready`.
     * @param {ContextOptions} [changes]
     */
    configure(changes?: ContextOptions): Promise<import("./protocol.js").ReadyMessage>;
    /** @param {string} text */
    text(text: string): void;
    flush(): void;
    end(): void;
    cancel(): void;
    close(): void;
}
export type ClientOptions = {
    /**
     * server (`http(s)://` or `ws(s)://` host, or the full endpoint URL); default: this page's server
     */
    url?: string | undefined;
    /**
     * API key, sent as the `token` query parameter (browsers cannot set WebSocket headers)
     */
    token?: string | undefined;
    /**
     * `opus` (default) falls back to `pcm_f32le` without WebCodecs Opus
     */
    format?: "opus" | "pcm_s16le" | "pcm_f32le" | undefined;
    /**
     * a saved voice id, or `default`
     */
    voice?: string | undefined;
    /**
     * segment k of each utterance uses seed + k
     */
    seed?: number | undefined;
    cfgValue?: number | undefined;
    inferenceTimesteps?: number | undefined;
    /**
     * how long an incomplete sentence waits for more text
     */
    maxBufferDelayMs?: number | undefined;
    /**
     * read numbers, dates and money as words (the server needs `voxwire[normalize]`)
     */
    normalize?: boolean | undefined;
    /**
     * a LoRA persona loaded on the server (`GET /v1/loras`); default: the base model
     */
    persona?: string | undefined;
    /**
     * VoxCPM2's voice design: a description of the voice, for every sentence
     */
    instructions?: string | undefined;
    /**
     * speaking speed, 0.25 to 4.0, pitch kept (default 1.0)
     */
    speed?: number | undefined;
    /**
     * audio buffered before playback starts; default one model chunk (`ready.chunk_s`)
     */
    leadSeconds?: number | undefined;
    /**
     * how a refused connection is retried
     */
    retry?: Partial<import("./reconnect.js").RetryPolicy> | undefined;
    /**
     * open a new connection when the session is lost (default true)
     */
    reconnect?: boolean | undefined;
    /**
     * where the player loads its AudioWorklet module (voxwire-client's
     * `worklet.js`) from; default: the copy built into the library, as a Blob URL (which a Content-Security-Policy
     * without `blob:` scripts refuses)
     */
    workletUrl?: string | URL | undefined;
    /**
     * the WebSocket implementation; default: the global `WebSocket`
     * (pass e.g. the `ws` package's where there is none, as in Node before 22)
     */
    WebSocket?: WebSocketClass | undefined;
};
/**
 * Live counters, updated in place (a page may expose the object itself, e.g. `window.voxwireStats`).
 */
export type ClientStats = import("./player.js").PlayerStats & {
    decoder: "webcodecs" | "pcm" | null;
    framesReceived: number;
    framesDropped: number;
    utterancesDone: number;
    firstAudio: FirstAudio | null;
};
/**
 * Milliseconds from an utterance's first `text()` to its first sample played (`latencyMs`), to its first
 * frame received and to its first audio decoded (null when not seen, e.g. PCM is not decoded).
 */
export type FirstAudio = {
    utterance: number;
    latencyMs: number;
    receivedMs: number | null;
    decodedMs: number | null;
};
/**
 * a WebSocket constructor, the browser's or a compatible one
 */
export type WebSocketClass = new (url: string) => WebSocket;
export type Timing = {
    textAt: number;
    receivedAt: number | null;
    decodedAt: number | null;
};
/**
 * A failure: the server's `error` message, or one of the client's own (`utterance` null), e.g. `decode_failed`,
 * `bad_frame`, or `reconnect_failed` when a lost session could not be resumed. Branch on `code`.
 */
export type ClientError = {
    code: string;
    message: string;
    utterance: number | null;
};
/**
 * The events a client dispatches, by name, and the `detail` each carries.
 */
export type ClientEvents = {
    /**
     * the settings in effect (after `connect()`, `configure()` and a reconnection)
     */
    ready: ReadyMessage;
    /**
     * a sentence starts
     */
    segment: SegmentMessage;
    /**
     * when some of a sentence's words are spoken (estimated from its audio, after its frames; a sentence's words may come in several parts, in order)
     */
    words: WordsMessage;
    /**
     * an utterance's first sample played
     */
    firstAudio: FirstAudio;
    /**
     * an utterance is finished (its audio may still be playing)
     */
    done: DoneMessage;
    /**
     * the buffer ran dry mid-sentence
     */
    underrun: {
        utterance: number;
    };
    error: ClientError;
    /**
     * the connection closed
     */
    close: {
        code: number;
        reason: string;
        reconnecting: boolean;
    };
    /**
     * a refused connection is tried again
     */
    retry: {
        retry: number;
        delayMs: number;
        reason: string;
    };
    /**
     * the connection was lost (1001,
     * 1006) before these utterances were done; what was received still plays, the rest of them is skipped
     */
    interrupted: {
        utterances: number[];
        code: number;
        reason: string;
    };
    /**
     * a new connection took over; text sent meanwhile went to it
     */
    reconnect: {};
};
/**
 * The settings a context may choose for itself; the format, lead and connection are the client's.
 */
export type ContextOptions = Pick<ClientOptions, "voice" | "seed" | "cfgValue" | "inferenceTimesteps" | "maxBufferDelayMs" | "normalize" | "persona" | "instructions" | "speed">;
/**
 * Audio of an utterance that must wait for the utterances opened before it, and whether its `done` came.
 */
export type Held = {
    frames: {
        frame: AudioFrame;
        segmentStart: boolean;
    }[];
    done: boolean;
};
/**
 * A listener of one of the client's events.
 */
export type ClientListener<Name extends keyof ClientEvents> = (this: VoxwireClient, event: CustomEvent<ClientEvents[Name]>) => void;
export type ClientMessage = import("./protocol.js").ClientMessage;
export type AudioFrame = import("./protocol.js").AudioFrame;
export type ReadyMessage = import("./protocol.js").ReadyMessage;
export type SegmentMessage = import("./protocol.js").SegmentMessage;
export type WordsMessage = import("./protocol.js").WordsMessage;
export type DoneMessage = import("./protocol.js").DoneMessage;
import { Player } from './player.js';
