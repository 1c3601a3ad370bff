'use strict';
// A minimal HTTP client on node:http, for the payment provider call and the tests.
// (fetch would do, but Debian 12's Node 18 still prints an "experimental" warning for it.)
const http = require('node:http');

// request(url, {method, headers, body, timeoutMs}) -> {status, headers, body (text)}
function request(url, { method = 'GET', headers = {}, body, timeoutMs = 10000 } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, timeout: timeoutMs }, (res) => {
      const chunks = [];
      res.on('data', (chunk) => chunks.push(chunk));
      res.on('end', () => resolve({
        status: res.statusCode,
        headers: res.headers,
        body: Buffer.concat(chunks).toString('utf8'),
      }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url} within ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end(body);
  });
}

module.exports = { request };
