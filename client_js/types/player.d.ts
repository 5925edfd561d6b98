/**
 * Whether this browser can decode Opus with WebCodecs (otherwise ask the server for PCM).
 * @returns {Promise<boolean>}
 */
export function supportsOpus(): Promise<boolean>;
/**
 * Add the jitter buffer's module to the audio context: from `url`, or from the source built into this module (a
 * Blob URL, which works wherever the library is bundled, with no file to copy).
 * @param {AudioContext} context
 * @param {string | URL | undefined} url
 */
export function loadWorklet(context: AudioContext, url: string | URL | undefined): Promise<void>;
/**
 * A PCM payload as float samples (copied: the worklet takes ownership of the buffer).
 * @param {string} format `pcm_f32le` or `pcm_s16le`
 * @param {Uint8Array} bytes
 * @returns {Float32Array}
 */
export function pcmSamples(format: string, bytes: Uint8Array): Float32Array;
/** @typedef {import('./protocol.js').AudioFrame} AudioFrame */
/** WebCodecs' Opus decoder outputs 48 kHz whatever the encoder's input rate was. */
export const OPUS_RATE: 48000;
/**
 * Counters the player keeps up to date (the client's `stats` object is passed in and written to).
 * @typedef {object} PlayerStats
 * @property {number} packetsDecoded Opus packets WebCodecs turned into audio
 * @property {number} samplesPlayed samples the worklet has output (silence excluded)
 * @property {number} bufferedSamples samples queued and not played yet: in the jitter buffer, or posted to the worklet
 *   and not arrived there yet (so it never reads 0 while decoded audio is on its way to the audio thread)
 * @property {number} underruns times the buffer ran dry mid-sentence
 * @property {number | null} playedAtCancel `samplesPlayed` when the last cancel reached the worklet
 */
/**
 * Per-utterance decoding state.
 * @typedef {object} Stream
 * @property {AudioDecoder | null} decoder null for PCM
 * @property {number} skip samples still to drop from the start (Opus pre-skip)
 * @property {number} packets packets fed so far (the next chunk's timestamp)
 * @property {Map<number, {first: boolean, segmentStart: boolean}>} marks flags of a frame's first packet, by timestamp
 * @property {{first: boolean, segmentStart: boolean}} carry flags of outputs trimmed away entirely
 */
export class Player extends EventTarget {
    /**
     * Build a player; call it from a user gesture (or `resume()` from one later) so audio may start.
     * @param {object} options
     * @param {string} options.format the session's frame format (`opus`, `pcm_f32le`, `pcm_s16le`)
     * @param {number} options.sampleRate the audio's rate (`ready.sample_rate`; 48 kHz for Opus)
     * @param {number} options.leadSeconds audio buffered before playback starts
     * @param {number} options.preSkip Opus: 48 kHz samples to drop at each utterance's start
     * @param {PlayerStats} options.stats counters to update
     * @param {number} [options.fadeSeconds] fade-out on `clear()` (avoids a click)
     * @param {string | URL} [options.workletUrl] where to load worklet.js from; default: its built-in copy, as a Blob URL
     * @returns {Promise<Player>}
     */
    static create({ format, sampleRate, leadSeconds, preSkip, stats, fadeSeconds, workletUrl }: {
        format: string;
        sampleRate: number;
        leadSeconds: number;
        preSkip: number;
        stats: PlayerStats;
        fadeSeconds?: number | undefined;
        workletUrl?: string | URL | undefined;
    }): Promise<Player>;
    /**
     * @param {AudioContext} context
     * @param {AudioWorkletNode} node
     * @param {AnalyserNode} analyser
     * @param {string} format
     * @param {number} preSkip
     * @param {PlayerStats} stats
     */
    constructor(context: AudioContext, node: AudioWorkletNode, analyser: AnalyserNode, format: string, preSkip: number, stats: PlayerStats);
    context: AudioContext;
    analyser: AnalyserNode;
    format: string;
    preSkip: number;
    stats: PlayerStats;
    node: AudioWorkletNode;
    /** @type {Map<number, Stream>} */
    streams: Map<number, Stream>;
    get sampleRate(): number;
    /** Let audio out; browsers keep a context suspended until a user gesture calls this. */
    resume(): void;
    /**
     * Decode a frame and queue its audio.
     * @param {AudioFrame} frame
     * @param {{segmentStart: boolean}} flags whether the frame starts a sentence (a `segment` came before it)
     */
    play(frame: AudioFrame, { segmentStart }: {
        segmentStart: boolean;
    }): void;
    /**
     * The utterance is done: decode what is left, then, if `idle` (nothing else is coming), let the
     * buffer play out below the lead without calling the end an underrun.
     * @param {number} utterance
     * @param {boolean} idle
     */
    finish(utterance: number, idle: boolean): Promise<void>;
    /** Barge-in: stop decoding everything in flight and silence the output after a few ms of fade. */
    clear(): void;
    close(): Promise<void>;
    #private;
}
export type AudioFrame = import("./protocol.js").AudioFrame;
/**
 * Counters the player keeps up to date (the client's `stats` object is passed in and written to).
 */
export type PlayerStats = {
    /**
     * Opus packets WebCodecs turned into audio
     */
    packetsDecoded: number;
    /**
     * samples the worklet has output (silence excluded)
     */
    samplesPlayed: number;
    /**
     * samples queued and not played yet: in the jitter buffer, or posted to the worklet
     * and not arrived there yet (so it never reads 0 while decoded audio is on its way to the audio thread)
     */
    bufferedSamples: number;
    /**
     * times the buffer ran dry mid-sentence
     */
    underruns: number;
    /**
     * `samplesPlayed` when the last cancel reached the worklet
     */
    playedAtCancel: number | null;
};
/**
 * Per-utterance decoding state.
 */
export type Stream = {
    /**
     * null for PCM
     */
    decoder: AudioDecoder | null;
    /**
     * samples still to drop from the start (Opus pre-skip)
     */
    skip: number;
    /**
     * packets fed so far (the next chunk's timestamp)
     */
    packets: number;
    /**
     * flags of a frame's first packet, by timestamp
     */
    marks: Map<number, {
        first: boolean;
        segmentStart: boolean;
    }>;
    /**
     * flags of outputs trimmed away entirely
     */
    carry: {
        first: boolean;
        segmentStart: boolean;
    };
};
