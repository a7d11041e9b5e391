from django.urls import path, re_path

from gateway import views

urlpatterns = [
    re_path(r"^v1/models/?$", views.models),
    re_path(r"^v1/models/(?P<name>.+)$", views.model_detail),
    re_path(r"^v1/?$", views.not_found),
    path("metrics", views.prometheus),
    re_path(r"^v1/(?P<path>.+)$", views.v1),
]
