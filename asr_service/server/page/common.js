// What the page's parts share: the language list, the API key field, times as people read them.

export const LANGUAGES = { en: "English", de: "German", es: "Spanish", fr: "French", it: "Italian", ja: "Japanese",
  nl: "Dutch", pt: "Portuguese", ru: "Russian", zh: "Chinese" };

export function fillLanguageSelect(select) {
  for (const [code, name] of Object.entries(LANGUAGES)) select.add(new Option(`${name} (${code})`, code));
}

export function apiKey() {
  return document.getElementById("api-key").value.trim();
}

export function authHeaders() {
  return apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {};
}

// 75.4 -> "1:15", 3725 -> "1:02:05"
export function clock(seconds) {
  const whole = Math.max(0, Math.floor(seconds));
  const h = Math.floor(whole / 3600), m = Math.floor((whole % 3600) / 60), s = whole % 60;
  const ss = String(s).padStart(2, "0");
  return h ? `${h}:${String(m).padStart(2, "0")}:${ss}` : `${m}:${ss}`;
}

// An OpenAI-shaped error body ({"error": {message, code}}) as one line for a status.
export function errorText(body, fallback) {
  const error = (body && body.error) || {};
  return error.message ? `${error.message} (${error.code || "no code"})` : fallback;
}
