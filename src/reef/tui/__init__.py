"""`reef review`: a Textual dashboard for candidates, releases and experience, live.

The app (`app`) shows a `reef.review.source.ReviewSource` in four tabs (`screens`: panes, detail
screens, dialogs; `widgets`: tables updated in place by key, the diff view, the score curve),
and never knows whether the source reads the project's stores or a server. Widgets post messages
(`messages`) that the app handles; what a decision will change and how it is asked and carried
out live in `decisions`.
"""
