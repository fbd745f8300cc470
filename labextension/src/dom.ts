/**
 * A tiny DOM builder: the panel is a handful of tables and bars, which plain
 * elements render faster and with fewer moving parts than a virtual DOM.
 */

export type Child = Node | string | number | null | undefined | false;

export interface IAttrs {
  [name: string]: string | number | boolean | null | undefined | ((ev: any) => void);
}

/**
 * Create an element: `h('button', {class: 'x', onclick: f, 'aria-label': 'Pause'}, 'Pause')`.
 *
 * Attributes starting with `on` are event listeners; `false`/`null`/`undefined`
 * attributes are left out, `true` sets an empty boolean attribute.
 */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: IAttrs = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value as EventListener);
    } else if (value === true) {
      el.setAttribute(name, '');
    } else {
      el.setAttribute(name, String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append children, skipping empty ones and turning text into text nodes. */
export function append(parent: Node, children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    parent.appendChild(typeof child === 'object' ? child : document.createTextNode(String(child)));
  }
}

/** Replace all children of `parent`. */
export function replaceChildren(parent: Element, ...children: Child[]): void {
  while (parent.firstChild) {
    parent.removeChild(parent.firstChild);
  }
  append(parent, children);
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** Create an SVG element with attributes (no listeners: the chart is static). */
export function s(tag: string, attrs: Record<string, string | number> = {}, ...children: Child[]): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) {
    el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}
