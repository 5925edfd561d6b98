/**
 * The wait before retry number `retry` (0-based), in milliseconds.
 * @param {number} retry
 * @param {RetryPolicy} policy
 * @param {() => number} [random] uniform in [0, 1)
 */
export function backoffMs(retry: number, policy: RetryPolicy, random?: () => number): number;
/**
 * Whether a connection that ended before its first `ready` was refused for now.
 * @param {{closeCode?: number, code?: string}} failure the close code, or the server's error code
 */
export function isRefusal(failure: {
    closeCode?: number;
    code?: string;
}): boolean;
/**
 * Whether the close of an established session cut it (as opposed to an error the server reported, or ours).
 * @param {number} closeCode
 */
export function isLoss(closeCode: number): closeCode is 1001 | 1006;
/**
 * Run `attempt` until it succeeds; a `RefusedError` is retried per `policy` with backoff and jitter.
 * @template T
 * @param {() => Promise<T>} attempt
 * @param {RetryPolicy} policy
 * @param {{onRetry?: (detail: {retry: number, delayMs: number, reason: string}) => void,
 *          sleep?: (ms: number) => Promise<void>, random?: () => number}} [hooks]
 * @returns {Promise<T>}
 */
export function withRetry<T>(attempt: () => Promise<T>, policy: RetryPolicy, hooks?: {
    onRetry?: (detail: {
        retry: number;
        delayMs: number;
        reason: string;
    }) => void;
    sleep?: (ms: number) => Promise<void>;
    random?: () => number;
}): Promise<T>;
/**
 * Recovering from refused and lost connections: what a close means, and how long to wait before trying again.
 *
 * A replica that is warming up, draining or full refuses a new connection with HTTP 503 before the upgrade
 * (an older server: an `error` `busy`/`unavailable`, then close 1013). Browsers do not show a refused
 * upgrade's status: it looks like close 1006 before the socket opened, so that is treated as a refusal too
 * (a wrong address is retried a few times, then reported). A session cut after it was established, by 1001
 * (the server went away) or 1006 (a killed replica, a network fault), is a loss: its utterance is cut short.
 *
 * @module reconnect
 */
export const CLOSE_GOING_AWAY: 1001;
export const CLOSE_ABNORMAL: 1006;
export const CLOSE_TRY_AGAIN_LATER: 1013;
/** Error codes a server refuses a new connection with before its first `ready`. */
export const REFUSAL_CODES: Set<string>;
/**
 * @typedef {object} RetryPolicy
 * @property {number} retries attempts after the first; 0 never retries
 * @property {number} firstDelayMs the first wait; each next one doubles
 * @property {number} maxDelayMs no wait is longer (before jitter)
 * @property {number} jitter each wait is stretched by a random factor in [1, 1 + jitter]
 */
/** @type {Readonly<RetryPolicy>} */
export const DEFAULT_RETRY: Readonly<RetryPolicy>;
/** A connection refused for now: worth trying again later. */
export class RefusedError extends Error {
}
export type RetryPolicy = {
    /**
     * attempts after the first; 0 never retries
     */
    retries: number;
    /**
     * the first wait; each next one doubles
     */
    firstDelayMs: number;
    /**
     * no wait is longer (before jitter)
     */
    maxDelayMs: number;
    /**
     * each wait is stretched by a random factor in [1, 1 + jitter]
     */
    jitter: number;
};
