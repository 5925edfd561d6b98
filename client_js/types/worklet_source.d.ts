/** @type {string} worklet.js's source: the player loads it as a Blob URL unless given a `workletUrl`. */
export const WORKLET_SOURCE: string;
