/**
 * @typedef {{string: string, int: number, float: number, boolean: boolean, 'string[]': string[], 'float[]': number[]}} FieldValues
 * @typedef {typeof CLIENT_MESSAGES} ClientMessageSpecs
 * @typedef {typeof SERVER_MESSAGES} ServerMessageSpecs
 */
/**
 * A message as sent: its `type`, its required fields, and any of its optional fields (unset: absent or null).
 * @template {Record<string, MessageSpec>} Specs
 * @template {keyof Specs} Type
 * @typedef {{type: Type}
 *   & {-readonly [Name in keyof Specs[Type] as Specs[Type][Name]['optional'] extends true ? never : Name]:
 *        FieldValues[Specs[Type][Name]['type']]}
 *   & {-readonly [Name in keyof Specs[Type] as Specs[Type][Name]['optional'] extends true ? Name : never]?:
 *        FieldValues[Specs[Type][Name]['type']] | null}} Sendable
 */
/**
 * A message as decoded from the server: every field of its type present, `null` when unknown, except an omitted
 * one (`context_id`), which is absent when unset.
 * @template {Record<string, MessageSpec>} Specs
 * @template {keyof Specs} Type
 * @typedef {{type: Type}
 *   & {-readonly [Name in keyof Specs[Type] as Specs[Type][Name] extends {omitted: true} ? never : Name]:
 *        FieldValues[Specs[Type][Name]['type']] | (Specs[Type][Name]['optional'] extends true ? null : never)}
 *   & {-readonly [Name in keyof Specs[Type] as Specs[Type][Name] extends {omitted: true} ? Name : never]?:
 *        FieldValues[Specs[Type][Name]['type']]}} Complete
 */
/**
 * A client message: `start` (session settings), `text`, `flush`, `end`, `cancel` or `close_context`.
 * @typedef {{[Type in keyof ClientMessageSpecs]: Sendable<ClientMessageSpecs, Type>}[keyof ClientMessageSpecs]} ClientMessage
 */
/**
 * A server message as `decodeServer` returns it: `ready`, `segment`, `words`, `done`, `error` or `audio`, every field
 * present but `context_id` (absent for the default context).
 * @typedef {{[Type in keyof ServerMessageSpecs]: Complete<ServerMessageSpecs, Type>}[keyof ServerMessageSpecs]} ServerMessage
 */
/**
 * A server message as `encodeServer` takes it (test servers): optional fields may be left out.
 * @typedef {{[Type in keyof ServerMessageSpecs]: Sendable<ServerMessageSpecs, Type>}[keyof ServerMessageSpecs]} ServerMessageInit
 */
/**
 * @typedef {Sendable<ClientMessageSpecs, 'start'>} StartMessage the settings of the utterances that follow
 * @typedef {Complete<ServerMessageSpecs, 'ready'>} ReadyMessage the settings in effect (the server's answer to a connection and to `start`)
 * @typedef {Complete<ServerMessageSpecs, 'segment'>} SegmentMessage a sentence of an utterance starts (its audio follows)
 * @typedef {Complete<ServerMessageSpecs, 'words'>} WordsMessage when some of a segment's words were spoken, estimated from its audio (after its frames; a segment's words may come in several parts, in order, each word once)
 * @typedef {Complete<ServerMessageSpecs, 'done'>} DoneMessage an utterance is finished
 * @typedef {Complete<ServerMessageSpecs, 'error'>} ErrorMessage what went wrong: `utterance` null for the session or a refused `start`
 * @typedef {Complete<ServerMessageSpecs, 'audio'>} AudioMessage an audio frame as JSON (`start.audio_transport` `json`): `audioFrameOf` reads it
 */
/**
 * Any message, for the checks that treat every type alike.
 * @typedef {{type: string, [field: string]: unknown}} Message
 */
/**
 * A client message as a compact JSON text frame, `type` first, unset (null or undefined) fields
 * omitted. The message is checked as the server would check it, so a bad one throws here.
 * @param {ClientMessage} message
 * @returns {string}
 * @throws {ProtocolError}
 */
export function encodeClient(message: ClientMessage): string;
/**
 * A server message as JSON text, every field present (`null` when unknown) but an unset `context_id`: for test
 * servers.
 * @param {ServerMessageInit} message
 * @returns {string}
 * @throws {ProtocolError}
 */
export function encodeServer(message: ServerMessageInit): string;
/**
 * Parse a server's text frame; every field of its type is present (`null` when unknown).
 * @param {string} text
 * @returns {ServerMessage}
 * @throws {ProtocolError}
 */
export function decodeServer(text: string): ServerMessage;
/**
 * Parse a client's text frame as the server does (for tests and mock servers).
 * @param {string} text
 * @returns {ClientMessage}
 * @throws {ProtocolError}
 */
export function decodeClient(text: string): ClientMessage;
/**
 * Parse a binary frame.
 * @param {ArrayBuffer | ArrayBufferView} data
 * @returns {AudioFrame}
 * @throws {ProtocolError} with code `bad_frame`
 */
export function decodeFrame(data: ArrayBuffer | ArrayBufferView): AudioFrame;
/**
 * The frame's bytes (for test servers; a client never sends audio).
 * @param {AudioFrame} frame
 * @returns {Uint8Array}
 */
export function encodeFrame({ format, utterance, sequence, packets, context_id: contextId }: AudioFrame): Uint8Array;
/**
 * The frame an `audio` message stands for: its base64 `audio` is exactly a binary frame's payload.
 * @param {AudioMessage} message
 * @returns {AudioFrame}
 * @throws {ProtocolError} with code `bad_frame`
 */
export function audioFrameOf(message: AudioMessage): AudioFrame;
/**
 * The `audio` message of a frame (for test servers).
 * @param {AudioFrame} frame
 * @returns {AudioMessage}
 */
export function audioMessageOf({ format, utterance, sequence, packets, context_id: contextId }: AudioFrame): AudioMessage;
/**
 * The WebSocket wire protocol of `/v1/tts/stream`, sans I/O: a mirror of the server's
 * `server/voxwire/protocol/wire.py`, checked against the same golden vectors
 * (`tests/fixtures/protocol_vectors.json`, see `protocol.test.js`). The normative specification is
 * `docs/protocol.md` in the voxwire repository.
 *
 * Control messages are JSON objects in text frames, discriminated by `type`. Audio travels in
 * binary frames (server to client): a 12-byte little-endian header (version, format, header size,
 * utterance, sequence), header extensions (the frame's `context_id`, when it has one), then the
 * payload; for `opus` the payload is u16-length-prefixed raw Opus packets. With
 * `start.audio_transport` `json` the same frames come as `audio` messages (the payload in base64).
 * Every message may name a `context_id`; server messages leave it out for the default context.
 * Decoders refuse what the server would refuse, with the same stable error codes.
 *
 * One deliberate difference: JavaScript numbers cannot tell `2.0` from `2`, so an integer field
 * given as `2.0` is accepted here where Python refuses it.
 *
 * @module protocol
 */
export const PROTOCOL_VERSION: 1;
export const FRAME_VERSION: 1;
/** The audio formats a session can stream; a frame's format byte is the index here. */
export const FRAME_FORMATS: readonly ["opus", "ogg_opus", "pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"];
/** @typedef {typeof FRAME_FORMATS[number]} AudioFormat */
/** The formats whose rate a client chooses with `start.sample_rate`. */
export const PCM_FORMATS: readonly ["pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"];
/** The rates `start.sample_rate` may ask for. */
export const SAMPLE_RATES: readonly [8000, 16000, 22050, 24000, 44100, 48000];
/** How audio reaches the client: binary frames, or `audio` JSON messages (base64). */
export const AUDIO_TRANSPORTS: readonly ["binary", "json"];
/** Longest `context_id`, in UTF-8 bytes. */
export const MAX_CONTEXT_ID_BYTES: 64;
export const FRAME_HEADER_SIZE: 12;
export const MAX_PACKET_BYTES: 65535;
export const MAX_SEED: number;
export const MAX_BUFFER_DELAY_MS: 60000;
export const MAX_PLAYBACK_LEAD_MS: 10000;
export const MIN_SPEED: 0.25;
export const MAX_SPEED: 4;
/** Stable `code` values of `error` messages and of `ProtocolError`. */
export const ErrorCode: Readonly<{
    INVALID_JSON: "invalid_json";
    INVALID_MESSAGE: "invalid_message";
    UNKNOWN_TYPE: "unknown_type";
    UNKNOWN_FIELD: "unknown_field";
    INVALID_FIELD: "invalid_field";
    OUT_OF_RANGE: "out_of_range";
    BAD_FRAME: "bad_frame";
}>;
/** A message or frame that cannot be accepted; branch on `code`, never on the text. */
export class ProtocolError extends Error {
    /**
     * @param {string} code an `ErrorCode` value
     * @param {string} message for humans
     */
    constructor(code: string, message: string);
    code: string;
}
export type FieldValues = {
    string: string;
    int: number;
    float: number;
    boolean: boolean;
    "string[]": string[];
    "float[]": number[];
};
export type ClientMessageSpecs = typeof CLIENT_MESSAGES;
export type ServerMessageSpecs = typeof SERVER_MESSAGES;
/**
 * A message as sent: its `type`, its required fields, and any of its optional fields (unset: absent or null).
 */
export type Sendable<Specs extends Record<string, MessageSpec>, Type extends keyof Specs> = {
    type: Type;
} & { -readonly [Name in keyof Specs[Type] as Specs[Type][Name]["optional"] extends true ? never : Name]: FieldValues[Specs[Type][Name]["type"]]; } & { -readonly [Name in keyof Specs[Type] as Specs[Type][Name]["optional"] extends true ? Name : never]?: FieldValues[Specs[Type][Name]["type"]] | null; };
/**
 * A message as decoded from the server: every field of its type present, `null` when unknown, except an omitted
 * one (`context_id`), which is absent when unset.
 */
export type Complete<Specs extends Record<string, MessageSpec>, Type extends keyof Specs> = {
    type: Type;
} & { -readonly [Name in keyof Specs[Type] as Specs[Type][Name] extends {
    omitted: true;
} ? never : Name]: FieldValues[Specs[Type][Name]["type"]] | (Specs[Type][Name]["optional"] extends true ? null : never); } & { -readonly [Name in keyof Specs[Type] as Specs[Type][Name] extends {
    omitted: true;
} ? Name : never]?: FieldValues[Specs[Type][Name]["type"]]; };
/**
 * A client message: `start` (session settings), `text`, `flush`, `end`, `cancel` or `close_context`.
 */
export type ClientMessage = { [Type in keyof ClientMessageSpecs]: Sendable<ClientMessageSpecs, Type>; }[keyof ClientMessageSpecs];
/**
 * A server message as `decodeServer` returns it: `ready`, `segment`, `words`, `done`, `error` or `audio`, every field
 * present but `context_id` (absent for the default context).
 */
export type ServerMessage = { [Type in keyof ServerMessageSpecs]: Complete<ServerMessageSpecs, Type>; }[keyof ServerMessageSpecs];
/**
 * A server message as `encodeServer` takes it (test servers): optional fields may be left out.
 */
export type ServerMessageInit = { [Type in keyof ServerMessageSpecs]: Sendable<ServerMessageSpecs, Type>; }[keyof ServerMessageSpecs];
/**
 * the settings of the utterances that follow
 */
export type StartMessage = Sendable<ClientMessageSpecs, "start">;
/**
 * the settings in effect (the server's answer to a connection and to `start`)
 */
export type ReadyMessage = Complete<ServerMessageSpecs, "ready">;
/**
 * a sentence of an utterance starts (its audio follows)
 */
export type SegmentMessage = Complete<ServerMessageSpecs, "segment">;
/**
 * when some of a segment's words were spoken, estimated from its audio (after its frames; a segment's words may come in several parts, in order, each word once)
 */
export type WordsMessage = Complete<ServerMessageSpecs, "words">;
/**
 * an utterance is finished
 */
export type DoneMessage = Complete<ServerMessageSpecs, "done">;
/**
 * what went wrong: `utterance` null for the session or a refused `start`
 */
export type ErrorMessage = Complete<ServerMessageSpecs, "error">;
/**
 * an audio frame as JSON (`start.audio_transport` `json`): `audioFrameOf` reads it
 */
export type AudioMessage = Complete<ServerMessageSpecs, "audio">;
/**
 * Any message, for the checks that treat every type alike.
 */
export type Message = {
    type: string;
    [field: string]: unknown;
};
export type AudioFormat = (typeof FRAME_FORMATS)[number];
export type FieldType = "string" | "int" | "float" | "boolean" | "string[]" | "float[]";
export type FieldSpec = {
    type: FieldType;
    optional: boolean;
    omitted?: boolean;
};
export type MessageSpec = Record<string, FieldSpec>;
/**
 * One binary frame: audio of `utterance`, in order by `sequence`. `packets` holds the Opus packets
 * for `opus` and a single block of bytes for the other formats (views into the frame, not copies).
 * `context_id` names the utterance's context (null or absent: the default context).
 */
export type AudioFrame = {
    format: AudioFormat;
    utterance: number;
    sequence: number;
    packets: Uint8Array[];
    context_id?: string | null;
};
/**
 * Fields of each message type, in the server's order (encoders write them in this order). The message
 * types below are derived from these tables, so a field is described once.
 * @satisfies {Record<string, MessageSpec>}
 */
declare const CLIENT_MESSAGES: Readonly<{
    start: {
        voice: Readonly<{
            type: "string";
            optional: true;
        }>;
        format: Readonly<{
            type: "string";
            optional: true;
        }>;
        seed: Readonly<{
            type: "int";
            optional: true;
        }>;
        cfg_value: Readonly<{
            type: "float";
            optional: true;
        }>;
        inference_timesteps: Readonly<{
            type: "int";
            optional: true;
        }>;
        max_buffer_delay_ms: Readonly<{
            type: "int";
            optional: true;
        }>;
        normalize: Readonly<{
            type: "boolean";
            optional: true;
        }>;
        playback_lead_ms: Readonly<{
            type: "int";
            optional: true;
        }>;
        max_ahead_ms: Readonly<{
            type: "int";
            optional: true;
        }>;
        persona: Readonly<{
            type: "string";
            optional: true;
        }>;
        instructions: Readonly<{
            type: "string";
            optional: true;
        }>;
        speed: Readonly<{
            type: "float";
            optional: true;
        }>;
        sample_rate: Readonly<{
            type: "int";
            optional: true;
        }>;
        audio_transport: Readonly<{
            type: "string";
            optional: true;
        }>;
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    text: {
        text: Readonly<{
            type: "string";
            optional: false;
        }>;
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    flush: {
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    end: {
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    cancel: {
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    close_context: {
        context_id: Readonly<{
            type: "string";
            optional: false;
        }>;
    };
}>;
/** @satisfies {Record<string, MessageSpec>} */
declare const SERVER_MESSAGES: Readonly<{
    ready: {
        protocol: Readonly<{
            type: "int";
            optional: false;
        }>;
        model: Readonly<{
            type: "string";
            optional: false;
        }>;
        format: Readonly<{
            type: "string";
            optional: false;
        }>;
        sample_rate: Readonly<{
            type: "int";
            optional: false;
        }>;
        chunk_s: Readonly<{
            type: "float";
            optional: false;
        }>;
        pre_skip: Readonly<{
            type: "int";
            optional: false;
        }>;
        voice: Readonly<{
            type: "string";
            optional: true;
        }>;
        seed: Readonly<{
            type: "int";
            optional: true;
        }>;
        cfg_value: Readonly<{
            type: "float";
            optional: false;
        }>;
        inference_timesteps: Readonly<{
            type: "int";
            optional: false;
        }>;
        max_buffer_delay_ms: Readonly<{
            type: "int";
            optional: false;
        }>;
        playback_lead_ms: Readonly<{
            type: "int";
            optional: false;
        }>;
        persona: Readonly<{
            type: "string";
            optional: true;
        }>;
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    segment: {
        utterance: Readonly<{
            type: "int";
            optional: false;
        }>;
        index: Readonly<{
            type: "int";
            optional: false;
        }>;
        text: Readonly<{
            type: "string";
            optional: false;
        }>;
        start_sample: Readonly<{
            type: "int";
            optional: false;
        }>;
        spoken: Readonly<{
            type: "string";
            optional: false;
        }>;
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    words: {
        utterance: Readonly<{
            type: "int";
            optional: false;
        }>;
        index: Readonly<{
            type: "int";
            optional: false;
        }>;
        words: Readonly<{
            type: "string[]";
            optional: false;
        }>;
        starts_s: Readonly<{
            type: "float[]";
            optional: false;
        }>;
        ends_s: Readonly<{
            type: "float[]";
            optional: false;
        }>;
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    done: {
        utterance: Readonly<{
            type: "int";
            optional: false;
        }>;
        finish_reason: Readonly<{
            type: "string";
            optional: false;
        }>;
        segments: Readonly<{
            type: "int";
            optional: false;
        }>;
        audio_s: Readonly<{
            type: "float";
            optional: false;
        }>;
        ttfa_s: Readonly<{
            type: "float";
            optional: true;
        }>;
        buffer_s: Readonly<{
            type: "float";
            optional: true;
        }>;
        engine_ttfc_s: Readonly<{
            type: "float";
            optional: true;
        }>;
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    error: {
        code: Readonly<{
            type: "string";
            optional: false;
        }>;
        message: Readonly<{
            type: "string";
            optional: false;
        }>;
        utterance: Readonly<{
            type: "int";
            optional: true;
        }>;
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
    audio: {
        format: Readonly<{
            type: "string";
            optional: false;
        }>;
        utterance: Readonly<{
            type: "int";
            optional: false;
        }>;
        sequence: Readonly<{
            type: "int";
            optional: false;
        }>;
        audio: Readonly<{
            type: "string";
            optional: false;
        }>;
        context_id: Readonly<{
            type: "string";
            optional: true;
            omitted: true;
        }>;
    };
}>;
export {};
