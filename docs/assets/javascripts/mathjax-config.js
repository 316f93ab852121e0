// MathJax 3 configuration, read by docs/assets/mathjax/tex-chtml.js (served from this site, never
// from a CDN). pymdownx.arithmatex (generic mode) wraps every formula in an element with the class
// "arithmatex" and \( ... \) or \[ ... \] delimiters; MathJax typesets only those elements.
// MathJax finds its fonts beside tex-chtml.js ([mathjax]/output/chtml/fonts/woff-v2, the default).
// A plain window.MathJax object: the site does not use Material's instant navigation, so each page
// load typesets its own formulas.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};
