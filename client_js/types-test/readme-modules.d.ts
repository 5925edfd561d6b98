// What README.md's examples import besides the package, declared as those packages declare it: the ws package's
// WebSocket (the browser's interface, which Node 18 and 20 lack) and Vite's `?url` imports (vite/client.d.ts).
declare module 'ws' {
  export const WebSocket: typeof globalThis.WebSocket;
}
declare module '*?url' {
  const url: string;
  export default url;
}
