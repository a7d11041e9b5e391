from django.urls import path, re_path

from gateway import views

# ``[\s\S]``, not ``.``: a path with a newline in it (``/v1/models/a%0Ab``) still reaches the
# gateway's views and gets an answer in OpenAI's shape, not Django's HTML 404.
urlpatterns = [
    re_path(r"^v1/models/?$", views.models),
    re_path(r"^v1/models/(?P<name>[\s\S]+)$", views.model_detail),
    re_path(r"^v1/?$", views.not_found),
    path("metrics", views.prometheus),
    re_path(r"^v1/(?P<path>[\s\S]+)$", views.v1),
]
