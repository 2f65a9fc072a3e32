// The web terminal's page (services/runtime/src/web.rs): xterm.js on a WebSocket to the runtime. The link's
// token comes in the URL's fragment, which the browser never sends to a server; it is taken out of the address
// bar at once and handed to the server as a WebSocket subprotocol, never in a URL.
(function () {
  'use strict';
  const status = document.getElementById('status');
  const show = (text, bad) => {
    status.textContent = text;
    status.className = bad ? 'bad' : '';
  };
  // The tab keeps the token and its terminal (sessionStorage: this tab only), so a reload attaches to the same
  // terminal again and replays its scrollback, while the token is valid.
  const linked = new URLSearchParams(location.hash.slice(1)).get('token');
  history.replaceState(null, '', location.pathname + location.search);
  if (linked) {
    sessionStorage.setItem('mentis.token', linked);
    sessionStorage.removeItem('mentis.terminal');
  }
  const token = sessionStorage.getItem('mentis.token');
  const previous = sessionStorage.getItem('mentis.terminal');

  const term = new Terminal({ cursorBlink: true, scrollback: 5000, fontSize: 14, theme: { background: '#1e1e1e' },
    fontFamily: 'DejaVu Sans Mono, Liberation Mono, monospace' });
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(document.getElementById('terminal'));
  fit.fit();
  // For tests and the browser's console: the terminal and the socket's state.
  window.mentis = { term, state: 'connecting', terminalId: null, error: null };
  const state = (s) => { window.mentis.state = s; document.body.dataset.state = s; };
  state('connecting');

  if (!token) {
    show('This page needs a link: ask the runtime for one (TerminalService.CreateTerminalLink).', true);
    state('closed');
    return;
  }
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const again = previous ? `&terminal=${encodeURIComponent(previous)}` : '';
  const ws = new WebSocket(`${scheme}//${location.host}/terminal/ws?cols=${term.cols}&rows=${term.rows}${again}`,
    ['mentis-terminal', 'token.' + token]);
  ws.binaryType = 'arraybuffer';
  const encoder = new TextEncoder();
  const send = (data) => { if (ws.readyState === WebSocket.OPEN) ws.send(data); };

  ws.onmessage = (e) => {
    if (typeof e.data !== 'string') {
      term.write(new Uint8Array(e.data));
      return;
    }
    const m = JSON.parse(e.data);
    if (m.type === 'started') {
      window.mentis.terminalId = m.terminal_id;
      sessionStorage.setItem('mentis.terminal', m.terminal_id);
      show(`terminal ${m.terminal_id}`);
      state('open');
      // The page may have changed size while connecting.
      if (m.cols !== term.cols || m.rows !== term.rows) {
        send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
      }
      term.focus();
    } else if (m.type === 'exited') {
      show(`the program exited (code ${m.exit_code}${m.signal ? ', signal ' + m.signal : ''})`);
      state('exited');
      sessionStorage.removeItem('mentis.terminal');
    } else if (m.type === 'error') {
      show(`error: ${m.reason || m.code}: ${m.message}`, true);
      window.mentis.error = m;
      // The terminal is gone: a reload starts a new one.
      if (m.reason === 'TERMINAL_NOT_FOUND') sessionStorage.removeItem('mentis.terminal');
    }
  };
  ws.onclose = (e) => {
    if (window.mentis.state === 'connecting') {
      show('the runtime refused the link (expired or invalid): ask for a new one', true);
    } else if (window.mentis.state === 'open' && !window.mentis.error) {
      show('disconnected', true);
    }
    if (window.mentis.state !== 'exited') state('closed');
  };
  term.onData((d) => send(encoder.encode(d)));
  term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(({ cols, rows }) => send(JSON.stringify({ type: 'resize', cols, rows })));
  // The terminal follows the window's size.
  let pending = null;
  window.addEventListener('resize', () => {
    clearTimeout(pending);
    pending = setTimeout(() => fit.fit(), 50);
  });
})();
