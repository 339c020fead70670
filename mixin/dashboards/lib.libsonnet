// Minimal builders for Grafana panels (schema 39, Grafana 10 and later), written out here so the
// mixin needs nothing but jsonnet. layout() numbers the panels and places them on the grid.
{
  datasource:: { type: 'prometheus', uid: '${datasource}' },

  datasourceVariable:: {
    name: 'datasource',
    label: 'Data source',
    type: 'datasource',
    query: 'prometheus',
    current: {},
    hide: 0,
    refresh: 1,
    regex: '',
  },

  // A variable filled from label_values(), or from query_result() with regex picking the value
  // out of each series; multi allows several values, includeAll adds "All" (allValue when set,
  // else Grafana's alternation of the values); hide: 0 shown, 2 hidden. Refreshed on each time
  // range change (dashboard-linter's template-on-time-change-reload-rule).
  queryVariable(name, label, query, multi=false, regex='', hide=0, includeAll=multi, allValue=null):: {
    name: name,
    label: label,
    type: 'query',
    datasource: $.datasource,
    query: { query: query, refId: name },
    definition: query,
    current: {},
    hide: hide,
    refresh: 2,
    sort: 3,
    regex: regex,
    includeAll: includeAll,
    multi: multi,
  } + (if allValue != null then { allValue: allValue } else {}),

  // The exporter's jobs: those of amd_hsmp_build_info (every target exports it) that selector
  // picks, the first the default. Several may be selected, and there is no "All": dashboard-linter's
  // '.+' for All would also select other jobs' up, scrape_* and process_* series; allValue is
  // there for template-job-rule.
  jobVariable(selector):: $.queryVariable('job', 'Job', 'label_values(amd_hsmp_build_info{%s}, job)' % selector, multi=true, includeAll=false, allValue='.+'),

  // The targets of the selected jobs (from up, so that a target that is down is listed), several
  // or all ('.+', within the jobs selected).
  instanceVariable(selector):: $.queryVariable('instance', 'Instance', 'label_values(up{%s}, instance)' % selector, multi=true, allValue='.+'),

  // The matchers of every panel query: the job and instance variables (dashboard-linter's
  // target-job-rule and target-instance-rule).
  variableSelector:: 'job=~"$job",instance=~"$instance"',

  target(expr, legend='', instant=false):: {
    datasource: $.datasource,
    expr: expr,
    legendFormat: legend,
    range: !instant,
    instant: instant,
    format: if instant then 'table' else 'time_series',
  },

  // Common panel fields; w and h are the size on the 24-column grid, placed by layout(); every
  // panel has a unit (dashboard-linter's panel-units-rule), 'none' where the values are states
  // or names.
  panel(type, title, description, targets, w, h, unit):: {
    type: type,
    title: title,
    description: description,
    datasource: $.datasource,
    targets: [
      t { refId: std.char(std.codepoint('A') + i) }
      for i in std.range(0, std.length(targets) - 1)
      for t in [targets[i]]
    ],
    fieldConfig: {
      defaults: { unit: unit },
      overrides: [],
    },
    w:: w,
    h:: h,
  },

  timeseries(title, description, targets, unit, w=24, h=8, min=0):: $.panel('timeseries', title, description, targets, w, h, unit) {
    fieldConfig+: { defaults+: { min: min, custom: { lineWidth: 1, fillOpacity: 10, showPoints: 'never', spanNulls: false } } },
    options: {
      legend: { showLegend: true, displayMode: 'table', placement: 'right', calcs: ['mean', 'max', 'lastNotNull'] },
      tooltip: { mode: 'multi', sort: 'desc' },
    },
  },

  // One row per series (legend = the series' name, e.g. a core id), colour = value.
  heatmap(title, description, targets, unit, w=24, h=10, scheme='Oranges'):: $.panel('heatmap', title, description, targets, w, h, unit) {
    options: {
      calculate: false,
      cellGap: 0,
      color: { mode: 'scheme', scheme: scheme, scale: 'exponential', steps: 64, exponent: 0.5, reverse: false, fill: 'dark-orange' },
      rowsFrame: { layout: 'auto' },
      yAxis: { axisPlacement: 'left', axisLabel: 'core' },
      cellValues: { unit: unit },
      showValue: 'never',
      tooltip: { mode: 'single', yHistogram: false, showColorScale: true },
      legend: { show: true },
      exemplars: { color: 'rgba(255,0,255,0.7)' },
    },
  },

  // The distribution of all series' values per time step (e.g. power of every node).
  distribution(title, description, targets, unit, w=24, h=8):: $.panel('heatmap', title, description, targets, w, h, unit) {
    options: {
      calculate: true,
      calculation: { yBuckets: { mode: 'count', value: '20' } },
      cellGap: 1,
      color: { mode: 'scheme', scheme: 'Blues', scale: 'exponential', steps: 64, exponent: 0.5, reverse: false, fill: 'dark-blue' },
      yAxis: { axisPlacement: 'left', unit: unit },
      showValue: 'never',
      tooltip: { mode: 'single', yHistogram: true, showColorScale: true },
      legend: { show: true },
    },
  },

  // mappings: [[value, text, colour], ...]
  valueMappings(mappings):: [{
    type: 'value',
    options: { [std.toString(m[0])]: { text: m[1], color: m[2], index: i } for i in std.range(0, std.length(mappings) - 1) for m in [mappings[i]] },
  }],

  upDown:: $.valueMappings([[0, 'down', 'red'], [1, 'up', 'green']]),

  stat(title, description, targets, unit, w=4, h=4, mappings=[], noValue=null, textMode='value', thresholds=null):: $.panel('stat', title, description, targets, w, h, unit) {
    fieldConfig+: {
      defaults+: {
        mappings: mappings,
        color: { mode: 'thresholds' },
        thresholds: if thresholds != null then thresholds else { mode: 'absolute', steps: [{ color: 'text', value: null }] },
      } + (if noValue != null then { noValue: noValue } else {}),
    },
    options: {
      reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
      colorMode: if std.length(mappings) > 0 || thresholds != null then 'background' else 'none',
      graphMode: 'none',
      textMode: textMode,
      justifyMode: 'auto',
      orientation: 'auto',
    },
  },

  // Steps: [[from, colour], ...], the first from is null.
  thresholds(steps):: { mode: 'absolute', steps: [{ value: s[0], color: s[1] } for s in steps] },

  stateTimeline(title, description, targets, mappings, unit='none', w=24, h=6):: $.panel('state-timeline', title, description, targets, w, h, unit) {
    fieldConfig+: {
      defaults+: {
        mappings: mappings,
        color: { mode: 'thresholds' },
        thresholds: $.thresholds([[null, 'green'], [1, 'red']]),
        custom: { lineWidth: 0, fillOpacity: 80 },
      },
    },
    options: {
      showValue: 'never',
      mergeValues: true,
      alignValue: 'left',
      rowHeight: 0.9,
      legend: { showLegend: false },
      tooltip: { mode: 'single' },
    },
  },

  // An instant query shown as a table, one row per series.
  table(title, description, targets, unit, w=12, h=8):: $.panel('table', title, description, targets, w, h, unit) {
    options: { showHeader: true, cellHeight: 'sm', footer: { show: false } },
    transformations: [
      { id: 'organize', options: { excludeByName: { Time: true, __name__: true } } },
    ],
  },

  // Instant queries joined into one table, one row per label set (Grafana's merge), each
  // target's value a column: columns = [[name, unit], ...] in the targets' order; sorted by the
  // first column, largest first.
  joinedTable(title, description, targets, columns, w=12, h=8):: $.table(title, description, targets, 'none', w, h) {
    fieldConfig+: {
      overrides: [{ matcher: { id: 'byName', options: c[0] }, properties: [{ id: 'unit', value: c[1] }] } for c in columns],
    },
    options+: { sortBy: [{ displayName: columns[0][0], desc: true }] },
    transformations: [
      { id: 'merge', options: {} },
      {
        id: 'organize',
        options: {
          excludeByName: { Time: true, __name__: true },
          renameByName: { ['Value #' + std.char(std.codepoint('A') + i)]: columns[i][0] for i in std.range(0, std.length(columns) - 1) },
        },
      },
    ],
  },

  row(title):: { type: 'row', title: title, collapsed: false, panels: [], w:: 24, h:: 1 },

  // Numbers the panels from 1 and places them left to right, wrapping at 24 columns; a row always
  // starts a new line.
  layout(panels)::
    local step(state, p) =
      local wrap = p.type == 'row' || state.x + p.w > 24;
      local x = if wrap then 0 else state.x;
      local y = if wrap then state.y + state.lineH else state.y;
      local lineH = if wrap then p.h else std.max(state.lineH, p.h);
      {
        x: x + p.w,
        y: y,
        lineH: lineH,
        out: state.out + [p { id: std.length(state.out) + 1, gridPos: { x: x, y: y, w: p.w, h: p.h } }],
      };
    std.foldl(step, panels, { x: 0, y: 0, lineH: 0, out: [] }).out,

  dashboard(config, uid, title, description, templating, panels):: {
    uid: uid,
    title: config.dashboardNamePrefix + title,
    description: description,
    tags: config.dashboardTags,
    timezone: config.dashboardTimezone,
    refresh: config.dashboardRefresh,
    schemaVersion: 39,
    version: 1,
    // Provisioned: a change made in Grafana is lost on the next provisioning; save a copy
    // instead (dashboard-linter's uneditable-dashboard).
    editable: false,
    graphTooltip: 1,
    time: { from: 'now-6h', to: 'now' },
    timepicker: {},
    annotations: { list: [] },
    links: [],
    templating: { list: templating },
    panels: $.layout(panels),
  },
}
