// Live pages: the server sends "changed" over server-sent events when the
// control plane's state changes; the page then fetches itself again and
// replaces its main section (no polling, no reload). A page being typed
// into is left alone until the field loses focus.
(function () {
  var source = document.body.getAttribute('data-live');
  if (!source || !window.EventSource) { return; }
  var pending = false, busy = false;
  function typing() {
    var a = document.activeElement;
    return a && a.closest && a.closest('main') && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName);
  }
  function refresh() {
    if (busy) { pending = true; return; }
    if (typing()) { pending = true; return; }
    busy = true; pending = false;
    fetch(location.href, { headers: { 'X-Meridian-Fragment': '1' }, credentials: 'same-origin' })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null) {
          var main = document.getElementById('main');
          main.innerHTML = html;
          document.body.setAttribute('data-updated', String(Date.now()));
        }
      })
      .catch(function () {})
      .then(function () { busy = false; if (pending) { refresh(); } });
  }
  document.addEventListener('focusout', function () { if (pending) { setTimeout(refresh, 0); } });
  var es = new EventSource(source);
  es.onmessage = refresh;
})();
