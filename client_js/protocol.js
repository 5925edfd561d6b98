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

export const PROTOCOL_VERSION = 1;
export const FRAME_VERSION = 1;
/** The audio formats a session can stream; a frame's format byte is the index here. */
export const FRAME_FORMATS = Object.freeze(
  /** @type {const} */ (['opus', 'ogg_opus', 'pcm_s16le', 'pcm_f32le', 'pcm_mulaw', 'pcm_alaw']),
);
/** @typedef {typeof FRAME_FORMATS[number]} AudioFormat */
/** The formats whose rate a client chooses with `start.sample_rate`. */
export const PCM_FORMATS = Object.freeze(/** @type {const} */ (['pcm_s16le', 'pcm_f32le', 'pcm_mulaw', 'pcm_alaw']));
/** The rates `start.sample_rate` may ask for. */
export const SAMPLE_RATES = Object.freeze(/** @type {const} */ ([8000, 16000, 22050, 24000, 44100, 48000]));
/** How audio reaches the client: binary frames, or `audio` JSON messages (base64). */
export const AUDIO_TRANSPORTS = Object.freeze(/** @type {const} */ (['binary', 'json']));
/** Longest `context_id`, in UTF-8 bytes. */
export const MAX_CONTEXT_ID_BYTES = 64;
export const FRAME_HEADER_SIZE = 12;
export const MAX_PACKET_BYTES = 0xffff;
export const MAX_SEED = 2 ** 63;
export const MAX_BUFFER_DELAY_MS = 60_000;
export const MAX_PLAYBACK_LEAD_MS = 10_000;
export const MIN_SPEED = 0.25;
export const MAX_SPEED = 4.0;

/** Stable `code` values of `error` messages and of `ProtocolError`. */
export const ErrorCode = Object.freeze({
  INVALID_JSON: 'invalid_json',
  INVALID_MESSAGE: 'invalid_message',
  UNKNOWN_TYPE: 'unknown_type',
  UNKNOWN_FIELD: 'unknown_field',
  INVALID_FIELD: 'invalid_field',
  OUT_OF_RANGE: 'out_of_range',
  BAD_FRAME: 'bad_frame',
});

/** A message or frame that cannot be accepted; branch on `code`, never on the text. */
export class ProtocolError extends Error {
  /**
   * @param {string} code an `ErrorCode` value
   * @param {string} message for humans
   */
  constructor(code, message) {
    super(message);
    this.name = 'ProtocolError';
    this.code = code;
  }
}

/**
 * @typedef {'string' | 'int' | 'float' | 'boolean' | 'string[]' | 'float[]'} FieldType
 * @typedef {{type: FieldType, optional: boolean, omitted?: boolean}} FieldSpec
 * @typedef {Record<string, FieldSpec>} MessageSpec
 */

const str = Object.freeze({ type: 'string', optional: false });
const int = Object.freeze({ type: 'int', optional: false });
const float = Object.freeze({ type: 'float', optional: false });
const optStr = Object.freeze({ type: 'string', optional: true });
const optInt = Object.freeze({ type: 'int', optional: true });
const optFloat = Object.freeze({ type: 'float', optional: true });
const optBool = Object.freeze({ type: 'boolean', optional: true });
const strings = Object.freeze({ type: /** @type {const} */ ('string[]'), optional: false });
const floats = Object.freeze({ type: /** @type {const} */ ('float[]'), optional: false });
/** `context_id`: optional, and left out of server messages of the default context (not sent as null). */
const context = Object.freeze({ type: 'string', optional: true, omitted: /** @type {const} */ (true) });

/**
 * Fields of each message type, in the server's order (encoders write them in this order). The message
 * types below are derived from these tables, so a field is described once.
 * @satisfies {Record<string, MessageSpec>}
 */
const CLIENT_MESSAGES = Object.freeze({
  start: {
    voice: optStr,
    format: optStr,
    seed: optInt,
    cfg_value: optFloat,
    inference_timesteps: optInt,
    max_buffer_delay_ms: optInt,
    normalize: optBool,
    playback_lead_ms: optInt,
    max_ahead_ms: optInt,
    persona: optStr,
    instructions: optStr,
    speed: optFloat,
    sample_rate: optInt,
    audio_transport: optStr,
    context_id: context,
  },
  text: { text: str, context_id: context },
  flush: { context_id: context },
  end: { context_id: context },
  cancel: { context_id: context },
  close_context: { context_id: str },
});

/** @satisfies {Record<string, MessageSpec>} */
const SERVER_MESSAGES = Object.freeze({
  ready: {
    protocol: int,
    model: str,
    format: str,
    sample_rate: int,
    chunk_s: float,
    pre_skip: int,
    voice: optStr,
    seed: optInt,
    cfg_value: float,
    inference_timesteps: int,
    max_buffer_delay_ms: int,
    playback_lead_ms: int,
    persona: optStr,
    context_id: context,
  },
  segment: { utterance: int, index: int, text: str, start_sample: int, spoken: str, context_id: context },
  words: { utterance: int, index: int, words: strings, starts_s: floats, ends_s: floats, context_id: context },
  done: {
    utterance: int,
    finish_reason: str,
    segments: int,
    audio_s: float,
    ttfa_s: optFloat,
    buffer_s: optFloat,
    engine_ttfc_s: optFloat,
    context_id: context,
  },
  error: { code: str, message: str, utterance: optInt, context_id: context },
  audio: { format: str, utterance: int, sequence: int, audio: str, context_id: context },
});

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
export function encodeClient(message) {
  const set = Object.entries(message).filter(([, value]) => value !== undefined && value !== null);
  checkMessage(Object.fromEntries(set), CLIENT_MESSAGES);
  const body = { type: message.type };
  for (const name of Object.keys(CLIENT_MESSAGES[message.type])) {
    if (message[name] !== undefined && message[name] !== null) body[name] = message[name];
  }
  return JSON.stringify(body);
}

/**
 * A server message as JSON text, every field present (`null` when unknown) but an unset `context_id`: for test
 * servers.
 * @param {ServerMessageInit} message
 * @returns {string}
 * @throws {ProtocolError}
 */
export function encodeServer(message) {
  checkMessage(message, SERVER_MESSAGES);
  const body = { type: message.type };
  for (const [name, field] of Object.entries(SERVER_MESSAGES[message.type])) {
    if (!(/** @type {FieldSpec} */ (field).omitted && message[name] == null)) body[name] = message[name] ?? null;
  }
  return JSON.stringify(body);
}

/**
 * Parse a server's text frame; every field of its type is present (`null` when unknown).
 * @param {string} text
 * @returns {ServerMessage}
 * @throws {ProtocolError}
 */
export function decodeServer(text) {
  return decode(text, SERVER_MESSAGES);
}

/**
 * Parse a client's text frame as the server does (for tests and mock servers).
 * @param {string} text
 * @returns {ClientMessage}
 * @throws {ProtocolError}
 */
export function decodeClient(text) {
  return decode(text, CLIENT_MESSAGES);
}

/**
 * @param {string} text
 * @param {Record<string, MessageSpec>} registry
 */
function decode(text, registry) {
  let obj;
  try {
    obj = JSON.parse(text);
  } catch (error) {
    throw new ProtocolError(ErrorCode.INVALID_JSON, `not a JSON text: ${error.message}`);
  }
  const message = checkMessage(obj, registry);
  // Decoded server messages carry every field, as the server sends them (an unset context_id stays absent).
  if (registry === SERVER_MESSAGES) {
    for (const [name, field] of Object.entries(registry[message.type])) {
      if (field.omitted) {
        if (message[name] === null) delete message[name];
      } else message[name] ??= null;
    }
  }
  return message;
}

/**
 * Check `obj` against its type's fields (then `start`'s ranges) and return it.
 * @param {unknown} obj
 * @param {Record<string, MessageSpec>} registry
 * @returns {Message}
 */
function checkMessage(obj, registry) {
  if (typeof obj !== 'object' || obj === null || Array.isArray(obj) || typeof obj.type !== 'string') {
    throw new ProtocolError(ErrorCode.INVALID_MESSAGE, 'a message is a JSON object with a string "type"');
  }
  const kind = obj.type;
  const spec = Object.hasOwn(registry, kind) ? registry[kind] : undefined;
  if (spec === undefined) throw unknownType(kind, registry);
  for (const name of Object.keys(obj)) {
    if (name !== 'type' && !Object.hasOwn(spec, name)) {
      throw new ProtocolError(ErrorCode.UNKNOWN_FIELD, `'${kind}' has no field '${name}'`);
    }
  }
  for (const [name, field] of Object.entries(spec)) {
    checkField(kind, name, obj[name], field);
  }
  if (kind === 'start') checkStartRanges(obj);
  if (kind === 'words') checkWordTimes(obj);
  if (registry === CLIENT_MESSAGES) checkContextId(obj);
  return /** @type {Message} */ (obj);
}

/**
 * @param {string} kind
 * @param {string} name
 * @param {unknown} value
 * @param {FieldSpec} field
 */
function checkField(kind, name, value, field) {
  if (value === undefined || value === null) {
    if (field.optional) return;
    if (value === undefined) throw new ProtocolError(ErrorCode.INVALID_FIELD, `'${kind}' needs the field '${name}'`);
  }
  if (field.type === 'string[]' || field.type === 'float[]') {
    if (!Array.isArray(value)) {
      throw new ProtocolError(ErrorCode.INVALID_FIELD, `${kind}.${name} must be an array, got ${jsonType(value)}`);
    }
    const item = { type: field.type === 'string[]' ? 'string' : 'float', optional: false };
    for (const each of value) checkField(kind, `${name}[]`, each, /** @type {FieldSpec} */ (item));
    return;
  }
  const ok =
    field.type === 'string' || field.type === 'boolean'
      ? typeof value === field.type
      : typeof value === 'number' && (field.type === 'float' || Number.isInteger(value));
  if (!ok) {
    const wanted = { string: 'a string', int: 'an integer', float: 'a number', boolean: 'a boolean' }[field.type];
    const allowed = wanted + (field.optional ? ' or null' : '');
    throw new ProtocolError(ErrorCode.INVALID_FIELD, `${kind}.${name} must be ${allowed}, got ${jsonType(value)}`);
  }
  if (typeof value === 'string' && LONE_SURROGATE.test(value)) {
    throw new ProtocolError(ErrorCode.INVALID_FIELD, `${kind}.${name} is not valid Unicode (a lone surrogate)`);
  }
}

/** In a `u` regex a surrogate pair is one code point, so only unpaired halves match (what UTF-8 cannot encode). */
const LONE_SURROGATE = /\p{Surrogate}/u;

/**
 * A `words` message has one start and one end per word, each end at or after its start, none before 0.
 * @param {Message} message
 */
function checkWordTimes(message) {
  const { words, starts_s: starts, ends_s: ends } = /** @type {{words: string[], starts_s: number[], ends_s: number[]}} */ (
    /** @type {unknown} */ (message)
  );
  if (words.length !== starts.length || words.length !== ends.length) {
    throw new ProtocolError(ErrorCode.INVALID_FIELD, 'words, starts_s and ends_s must have one item per word');
  }
  if (!starts.every((start, i) => start >= 0 && start <= ends[i])) {
    throw new ProtocolError(ErrorCode.OUT_OF_RANGE, 'words.starts_s and ends_s must be times >= 0, each end >= its start');
  }
}

/** @param {Message} start */
function checkStartRanges(start) {
  const { format, seed, cfg_value: cfg, inference_timesteps: steps, max_buffer_delay_ms: delay } = start;
  const lead = start.playback_lead_ms;
  checkRange(format == null || FRAME_FORMATS.includes(/** @type {string} */ (format)), 'format', `one of ${FRAME_FORMATS}`);
  checkRange(seed == null || (Number.isFinite(seed) && seed >= 0 && seed < MAX_SEED), 'seed', 'in [0, 2**63)');
  checkRange(cfg == null || Number.isFinite(cfg), 'cfg_value', 'finite');
  checkRange(steps == null || steps >= 1, 'inference_timesteps', '>= 1');
  checkRange(delay == null || (delay >= 0 && delay <= MAX_BUFFER_DELAY_MS), 'max_buffer_delay_ms', 'in [0, 60000]');
  checkRange(lead == null || (lead >= 0 && lead <= MAX_PLAYBACK_LEAD_MS), 'playback_lead_ms', 'in [0, 10000]');
  const ahead = start.max_ahead_ms;
  checkRange(ahead == null || ahead >= 1, 'max_ahead_ms', '>= 1');
  const speed = start.speed;
  checkRange(speed == null || (speed >= MIN_SPEED && speed <= MAX_SPEED), 'speed', `in [${MIN_SPEED}, ${MAX_SPEED}]`);
  const { sample_rate: rate, audio_transport: transport } = start;
  checkRange(rate == null || SAMPLE_RATES.includes(/** @type {any} */ (rate)), 'sample_rate', `one of ${SAMPLE_RATES}`);
  const pcm = PCM_FORMATS.includes(/** @type {any} */ (format));
  checkRange(rate == null || pcm, 'sample_rate', `set with a format of ${PCM_FORMATS}`);
  checkRange(transport == null || AUDIO_TRANSPORTS.includes(/** @type {any} */ (transport)), 'audio_transport', `one of ${AUDIO_TRANSPORTS}`);
}

/** @param {Message} message */
function checkContextId(message) {
  const id = message.context_id;
  if (typeof id === 'string' && !(id.length > 0 && utf8.encode(id).length <= MAX_CONTEXT_ID_BYTES)) {
    const rule = `must have 1..${MAX_CONTEXT_ID_BYTES} UTF-8 bytes`;
    throw new ProtocolError(ErrorCode.OUT_OF_RANGE, `${message.type}.context_id ${rule}`);
  }
}

const utf8 = new TextEncoder();

/**
 * @param {boolean} ok
 * @param {string} name
 * @param {string} rule
 */
function checkRange(ok, name, rule) {
  if (!ok) throw new ProtocolError(ErrorCode.OUT_OF_RANGE, `start.${name} must be ${rule}`);
}

/**
 * @param {unknown} kind
 * @param {Record<string, MessageSpec>} registry
 */
function unknownType(kind, registry) {
  const known = Object.keys(registry).join(', ');
  return new ProtocolError(ErrorCode.UNKNOWN_TYPE, `unknown message type '${kind}' (expected one of ${known})`);
}

/** @param {unknown} value */
function jsonType(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return { boolean: 'a boolean', object: 'an object', string: 'a string', number: 'a number' }[typeof value] ?? typeof value;
}

// ---- binary audio frames ------------------------------------------------------------------------

/**
 * One binary frame: audio of `utterance`, in order by `sequence`. `packets` holds the Opus packets
 * for `opus` and a single block of bytes for the other formats (views into the frame, not copies).
 * `context_id` names the utterance's context (null or absent: the default context).
 * @typedef {{format: AudioFormat, utterance: number, sequence: number, packets: Uint8Array[],
 *   context_id?: string | null}} AudioFrame
 */

/** Header extension tags: a field is [tag u8][length u8][value]; tag 0 is padding and ends the fields. */
const PADDING_TAG = 0;
const CONTEXT_TAG = 1;

/**
 * Parse a binary frame.
 * @param {ArrayBuffer | ArrayBufferView} data
 * @returns {AudioFrame}
 * @throws {ProtocolError} with code `bad_frame`
 */
export function decodeFrame(data) {
  const bytes = asBytes(data);
  if (bytes.length < FRAME_HEADER_SIZE) {
    throw new ProtocolError(ErrorCode.BAD_FRAME, `a frame has at least ${FRAME_HEADER_SIZE} bytes`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const version = view.getUint8(0);
  const formatIndex = view.getUint8(1);
  const headerSize = view.getUint16(2, true);
  if (
    version !== FRAME_VERSION ||
    formatIndex >= FRAME_FORMATS.length ||
    headerSize < FRAME_HEADER_SIZE ||
    headerSize > bytes.length
  ) {
    throw new ProtocolError(
      ErrorCode.BAD_FRAME,
      `bad header: version ${version}, format ${formatIndex}, size ${headerSize}`,
    );
  }
  const format = FRAME_FORMATS[formatIndex];
  const payload = bytes.subarray(headerSize);
  return {
    format,
    utterance: view.getUint32(4, true),
    sequence: view.getUint32(8, true),
    packets: format === 'opus' ? splitPackets(payload) : [payload],
    context_id: readExtensions(bytes.subarray(FRAME_HEADER_SIZE, headerSize)),
  };
}

/**
 * The context id among a header's extension fields; fields of unknown tags are skipped.
 * @param {Uint8Array} extensions
 * @returns {string | null}
 */
function readExtensions(extensions) {
  let contextId = null;
  let offset = 0;
  while (offset < extensions.length && extensions[offset] !== PADDING_TAG) {
    if (offset + 2 > extensions.length) throw new ProtocolError(ErrorCode.BAD_FRAME, 'truncated header extension');
    const [tag, size] = [extensions[offset], extensions[offset + 1]];
    offset += 2;
    if (offset + size > extensions.length) {
      throw new ProtocolError(ErrorCode.BAD_FRAME, `header extension of ${size} bytes does not fit the header`);
    }
    if (tag === CONTEXT_TAG) {
      try {
        contextId = strictUtf8.decode(extensions.subarray(offset, offset + size));
      } catch {
        throw new ProtocolError(ErrorCode.BAD_FRAME, 'the context id is not UTF-8');
      }
    }
    offset += size;
  }
  return contextId;
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * The header extension naming `contextId` (none for the default context), zero-padded so that the header
 * stays a multiple of 4 bytes.
 * @param {string | null | undefined} contextId
 */
function contextExtension(contextId) {
  if (contextId == null) return new Uint8Array(0);
  const value = utf8.encode(contextId);
  if (value.length > 0xff) throw new RangeError(`a context id has at most 255 UTF-8 bytes, got ${value.length}`);
  const size = 2 + value.length;
  const field = new Uint8Array(size + ((4 - ((FRAME_HEADER_SIZE + size) % 4)) % 4));
  field.set([CONTEXT_TAG, value.length]);
  field.set(value, 2);
  return field;
}

/**
 * The frame's bytes (for test servers; a client never sends audio).
 * @param {AudioFrame} frame
 * @returns {Uint8Array}
 */
export function encodeFrame({ format, utterance, sequence, packets, context_id: contextId }) {
  const formatIndex = FRAME_FORMATS.indexOf(format);
  if (formatIndex < 0) throw new RangeError(`unknown format ${format}`);
  const extension = contextExtension(contextId);
  const headerSize = FRAME_HEADER_SIZE + extension.length;
  const payload = framePayload(format, packets);
  const bytes = new Uint8Array(headerSize + payload.length);
  const view = new DataView(bytes.buffer);
  view.setUint8(0, FRAME_VERSION);
  view.setUint8(1, formatIndex);
  view.setUint16(2, headerSize, true);
  view.setUint32(4, utterance, true);
  view.setUint32(8, sequence, true);
  bytes.set(extension, FRAME_HEADER_SIZE);
  bytes.set(payload, headerSize);
  return bytes;
}

/**
 * The bytes after a frame's header: Opus packets each behind its u16 length, else the format's bytes.
 * @param {AudioFormat} format
 * @param {Uint8Array[]} packets
 */
function framePayload(format, packets) {
  const opus = format === 'opus';
  for (const packet of opus ? packets : []) {
    if (packet.length === 0 || packet.length > MAX_PACKET_BYTES) {
      throw new RangeError(`an Opus packet must have 1..${MAX_PACKET_BYTES} bytes, got ${packet.length}`);
    }
  }
  const bytes = new Uint8Array(packets.reduce((total, packet) => total + packet.length + (opus ? 2 : 0), 0));
  const view = new DataView(bytes.buffer);
  let offset = 0;
  for (const packet of packets) {
    if (opus) {
      view.setUint16(offset, packet.length, true);
      offset += 2;
    }
    bytes.set(packet, offset);
    offset += packet.length;
  }
  return bytes;
}

/** @param {Uint8Array} payload */
function splitPackets(payload) {
  const packets = [];
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  let offset = 0;
  while (offset < payload.length) {
    if (offset + 2 > payload.length) throw new ProtocolError(ErrorCode.BAD_FRAME, 'truncated packet length');
    const size = view.getUint16(offset, true);
    offset += 2;
    if (size === 0 || offset + size > payload.length) {
      throw new ProtocolError(ErrorCode.BAD_FRAME, `packet of ${size} bytes at offset ${offset} does not fit`);
    }
    packets.push(payload.subarray(offset, offset + size));
    offset += size;
  }
  return packets;
}

/** @param {ArrayBuffer | ArrayBufferView} data */
function asBytes(data) {
  return data instanceof ArrayBuffer
    ? new Uint8Array(data)
    : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

// ---- audio as JSON messages (`start.audio_transport` `json`) -------------------------------------

/**
 * The frame an `audio` message stands for: its base64 `audio` is exactly a binary frame's payload.
 * @param {AudioMessage} message
 * @returns {AudioFrame}
 * @throws {ProtocolError} with code `bad_frame`
 */
export function audioFrameOf(message) {
  const { format, utterance, sequence, audio } = message;
  if (!FRAME_FORMATS.includes(/** @type {any} */ (format))) {
    throw new ProtocolError(ErrorCode.BAD_FRAME, `unknown audio format '${format}'`);
  }
  const payload = fromBase64(audio);
  const packets = format === 'opus' ? splitPackets(payload) : [payload];
  return { format: /** @type {AudioFormat} */ (format), utterance, sequence, packets, context_id: message.context_id ?? null };
}

/**
 * The `audio` message of a frame (for test servers).
 * @param {AudioFrame} frame
 * @returns {AudioMessage}
 */
export function audioMessageOf({ format, utterance, sequence, packets, context_id: contextId }) {
  const message = { type: /** @type {const} */ ('audio'), format, utterance, sequence, audio: toBase64(framePayload(format, packets)) };
  return contextId == null ? message : { ...message, context_id: contextId };
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** @param {string} text RFC 4648 base64, with padding */
function fromBase64(text) {
  if (!BASE64.test(text)) throw new ProtocolError(ErrorCode.BAD_FRAME, 'audio is not base64');
  return Uint8Array.from(atob(text), (char) => char.charCodeAt(0));
}

/** @param {Uint8Array} bytes */
function toBase64(bytes) {
  let text = '';
  for (let at = 0; at < bytes.length; at += 0x8000) text += String.fromCharCode(...bytes.subarray(at, at + 0x8000));
  return btoa(text);
}
